import configparser, subprocess
path = "/home/dev/service/settings.ini"
assert subprocess.run(["cfgcheck", path]).returncode == 0
config = configparser.ConfigParser()
config.read(path)
assert dict(config["server"]) == {"host": "0.0.0.0", "port": "8080", "workers": "4"}
assert dict(config["log"]) == {"level": "info"}
