"""The clocks and the event order: the simulator that orders every rank's operations on the
network (simulator.py), the messages ranks send it (protocol.py) and how they travel
(transport.py), each rank's clock (clock.py: simulated; measured.py: real) and compute."""
