"""Consumer groups across nodes: the GROUP beat and the membership view it builds."""
