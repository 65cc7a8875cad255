"""Test adapter module that forgot ADAPTER."""

ENTRIES = {}
