"""Analyses of trained and freshly initialised models: head scores, attention maps, signal propagation."""
