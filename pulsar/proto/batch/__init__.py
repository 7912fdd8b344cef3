"""BATCH: the control messages of many topics for one neighbour in one frame (`messages.py`),
and packing a step's control messages per neighbour into them (`packing.py`)."""
