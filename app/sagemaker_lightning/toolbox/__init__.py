"""What every room uses, low in the house so that no concern imports up into the hub (cli/).

concern.py            the one shape of a trainer concern: Context → Part, and the callbacks' order
lightning_package.py  lightning.pytorch or pytorch_lightning: the runtime's mixins made into the project's classes
redact.py             secrets out of what a job keeps
status.py             what the watchdog shares with the rest of the process: the busy mark, ending, the hosts' spread
location.py           a URL or a path of this machine, and what is inside it: the one local/remote predicate
"""
