"""What the shim does, once a finding is applied in fix mode: reopen files by
path (``reopen``), send functions and classes by value (``byvalue``), the
WorkerPickler's reducers both use (``pickling``), move tensors off a
device (``relocate``), run steps in every worker (``workerinit``, ``cv2``,
``limits``), emulated workers (``emulated_workers``) and batches copied back to
their device (``batchdevice``)."""
