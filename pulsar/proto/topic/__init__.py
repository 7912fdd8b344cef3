"""A topic at one node: its tree's life (:mod:`.lifecycle`), its edges (:mod:`.edges`)
and the events along it (:mod:`.dissemination`) — the tree protocol composed with the
lazy links, repair and fragments it relies on."""
