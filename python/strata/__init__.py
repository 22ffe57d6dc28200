"""strata: the Python client of strata, a service that holds the ZeRO-sharded
FP32 master weights and Adam states of a model on shard servers.

  strata.torch.ShardedOptimizer  a torch optimizer backed by a strata job
  strata.launch                  python3 -m strata.launch --workers N script.py
  strata.cluster.LocalCluster    a coordinator and shard servers on loopback

strata.Client and strata.connect are the C++ client's binding (strata::Client);
its errors are strata.StrataError ("CODE: message").
"""

from strata._strata import Client, StrataError, connect, flat_layout

__all__ = ["Client", "StrataError", "connect", "flat_layout"]
