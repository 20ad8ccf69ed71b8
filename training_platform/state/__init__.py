"""The platform's shared state: what every machine of a team's deployment reads and writes.

`database.py` is the platform's database (`TP_DATABASE_URL`), or none: the embedded default keeps its state in files
of the platform home. `documents.py` holds the small named JSON records the platform's parts share (the sweeps and
runs waiting for their cost window) and the locks they take, in files of the home; `documents_db.py` holds them as
rows of the database; `backends.py` chooses between the two for a deployment (`open_documents`, `shared_lock`).
"""
