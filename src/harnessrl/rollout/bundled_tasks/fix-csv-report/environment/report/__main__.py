import sys

from report.parse import read_rows
from report.summary import summarize

for department, stats in sorted(summarize(read_rows(sys.argv[1])).items()):
    print(department, stats)
