"""Where state lives. ``counters`` holds admission counts; policy lives in ``haltwire.gateway.ceilings``."""
