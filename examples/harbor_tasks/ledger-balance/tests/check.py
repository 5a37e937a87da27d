import ledgerlib
total = sum(ledgerlib.read("/srv/ledger/transactions.csv"))
assert total == 116536, total
assert open("/srv/ledger/balance.txt").read() == f"{total}\n"
