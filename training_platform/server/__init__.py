"""The platform server of a platform home: the Dagster code server, webserver and daemon `tp` starts and finds.

`local.py` starts, finds and stops them for one home on one machine (`tp server start|stop|status`, and any `tp`
command that needs the server), and writes the Dagster instance config they share (the queue, the storage).
"""
