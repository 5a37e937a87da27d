# list_sizes DIR: "path size" for every file under DIR, sorted by path
list_sizes() {
  (cd "$1" && find . -type f -printf '%P %s\n' | LC_ALL=C sort)
}
