lines = open("/srv/report/adults.tsv").read().splitlines()
assert lines == ["name\tage\tcity", "bob\t45\tKyiv", "mia\t18\tLima",
                 "zoe\t31\tOslo"], lines
