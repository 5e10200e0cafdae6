"""minibert-spec specification: what must be true.

``spec.numerics`` (finite differences, identities) and ``spec.tolerances`` hold the checking
machinery (NumPy only); the SymPy equations and the claims ledger live beside them.
"""
