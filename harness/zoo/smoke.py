"""The smoke zoo: a fixed list of ids, one or two per task family of both libraries, chosen among entries
whose CPU baseline passes, so a smoke sweep measures the backend and not the zoo."""

SMOKE_IDS: list[str] = []
