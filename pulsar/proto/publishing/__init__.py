"""Publishing: rights, linking, the write quorum, heads records and learning before
publishing (:mod:`.publisher`), our events on their way into the DHT (:mod:`.stores`)
and the heads records that acknowledge them (:mod:`.records`)."""
