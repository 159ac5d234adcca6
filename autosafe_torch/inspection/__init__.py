"""What the shim looks at, never changing it: the objects a dataset holds
(``objwalk``, ``holdings``, ``tensors``), whether they pickle for a spawned
worker (``probe``), and the ``__main__`` module a child re-creates
(``mainmodule``). Of user code it runs only what pickling runs
(``__reduce_ex__``, ``__getstate__``) and, once per class of an
attribute-forwarding object, ``cls.__new__`` (``holdings``)."""
