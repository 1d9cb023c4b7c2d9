from monitor.cli import run

run()
