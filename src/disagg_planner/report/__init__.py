"""Diagnostics recording and HTML reports, shared by the live controller and replay."""
