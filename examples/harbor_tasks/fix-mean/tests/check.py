import sys
sys.path.insert(0, "/workspace/calc")
import calc
assert calc.mean([1, 2, 3, 4]) == 2.5
assert calc.mean([5]) == 5.0
assert calc.mean([]) == 0.0
assert "calcbase.total" in open("/workspace/calc/calc.py").read()
