import csv


def read_rows(path: str) -> list[dict]:
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        next(reader)  # skip the header
        return [dict(row, salary=int(row["salary"])) for row in reader]
