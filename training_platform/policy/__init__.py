"""Who may run what, where: the teams of a platform home and the checks every entry point runs before a launch.

`teams.py` reads the teams file (members, budgets, where each team may run); `team_policy.py` holds a spec to its
own team's namespaces, queues, accounts and partitions and fills in its defaults; `preflight.py` runs every check
against a spec (its team, its files, its secrets, its evaluation) before anything is submitted.
"""
