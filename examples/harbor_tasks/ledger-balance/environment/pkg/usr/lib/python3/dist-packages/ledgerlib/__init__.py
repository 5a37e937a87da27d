"""Ledger files: date,memo,amount rows; amounts as integer cents."""
import csv


def read(path):
    with open(path, newline="") as handle:
        return [round(float(row["amount"]) * 100) for row in csv.DictReader(handle)]
