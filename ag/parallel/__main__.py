"""``mpiexec -n T python -m ag.parallel``: the tensor-parallel layer's bytes per rank (``--check``: its gradients)."""
import sys

from .tensor_parallel import main

sys.exit(main())
