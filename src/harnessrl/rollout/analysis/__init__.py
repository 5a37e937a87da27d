"""What a run's recorded turns say: chains, why they broke (drift), what each call was for
(kinds), and the drift atlas over them. Pure functions over the store's rows."""
