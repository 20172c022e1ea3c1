"""`python -m hbmcoll.variables`, the documented name of the variables' table (hbmcoll.tools.variables)."""
from .tools.variables import BEGIN, END, names, rows, table  # noqa: F401

if __name__ == "__main__":
    print(table())
