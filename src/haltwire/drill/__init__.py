"""``haltwire drill``: measure the time from a stop to the last side effect, rung by rung.

A client of the other processes, as the demos are: it starts a stack of its own
(``drill.stack``), runs canary agents through it (``drill.agents``), issues and clears stops
(``drill.rungs``), and judges the figures against the agent class's ``time_to_stop_s``
(``drill.figures``, ``drill.html`` for the report). ``drill.canary`` is the upstream that
records every side effect; ``drill.remote`` drills a running stack instead of its own.
"""
