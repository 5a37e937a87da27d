import utils
from utils import clamp, slug

print(slug("Hello Big World"), utils.title("a tale of two cities"),
      clamp(15, 0, 10), utils.mean([1, 2, 3, 4]))
