"""What the shim looks at, never changing it: the objects a dataset holds
(``objwalk``, ``holdings``, ``tensors``), whether they pickle for a spawned
worker (``probe``), and the ``__main__`` module a child re-creates
(``mainmodule``). Nothing here calls user code."""
