"""Suite-wide collection order: the end-to-end tests (marked ``slow``) run first.

pytest-xdist hands tests out in collection order as its workers free up. With the runs of tens of seconds spread over
the directories, the last ones could start when little else was left, and one worker would run them alone while the
other idled (the CPU log of a CI run showed a core idle for the last minutes). Started first, they overlap each other
and the thousands of short tests fill the gaps. The order inside each group is the collected one.
"""


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
