"""Worked examples of conformance mode: a class-based implementation and its adapter, a
deliberately broken adapter, and a small optimizer written to the protocol."""
