"""The msprobe dump layout: reading dump.json / stack.json / construct.json and finding rank directories."""
