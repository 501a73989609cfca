"""The decision core: pure functions and state machines that turn observations and a time
into scaling decisions with reasons. No I/O, no wall clock: live, replay and tests share it.
"""
