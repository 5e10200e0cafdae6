"""minibert-spec specification: what must be true, and the suite that judges an implementation.

Layered, top to bottom (each layer imports only the layers below it; the contract, with a
comment per layer, is ``[tool.importlinter]`` in pyproject.toml, checked by ``lint-imports``):
``cli`` -> ``report`` -> ``audit | mutation`` -> ``evidence`` -> ``claims | mutants`` ->
``benchproc`` -> ``bench`` -> ``suite`` -> ``equations | costs`` -> ``numerics`` -> ``protocol``
-> ``documents | components | tolerances | paths`` -> ``sources``.
"""
