"""The wire: the codec from frames to the closed union of every message kind, and BATCH,
which packs a step's control messages per neighbour into one frame. (The fields and limits
every message module shares are in :mod:`pulsar.proto.fields`.)"""
