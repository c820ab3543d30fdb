# fixture: never run
def main [] {}
