"""Wire conformance vectors (docs/protocol.md section 10): pub-sub messages, a Noise XX
handshake transcript and DHT datagrams, as exact bytes with their decoded fields.

The JSON files beside this module are written by :mod:`tests.conformance.generate`
(``python -m tests.conformance.generate``); the tests here check them against the code.
"""
