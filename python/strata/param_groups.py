"""strata.param_groups: the param_groups a strata.torch.ShardedOptimizer
is given, checked against its model and mapped to its parameters (the
shard servers then apply each group's learning rate and weight decay)."""

import torch


def groups_of(named, param_groups):
    """(groups for torch.optim.Optimizer, each named parameter's group
    index); one group of every parameter when `param_groups` is None."""
    if param_groups is None:
        return [p for _, p in named], None
    groups, index = [], {}
    for group in param_groups:
        group = dict(group)
        params = group["params"]
        group["params"] = [params] if isinstance(params, torch.Tensor) else list(params)
        for p in group["params"]:
            if id(p) in index:
                raise ValueError("a parameter is in two of param_groups")
            index[id(p)] = len(groups)
        groups.append(group)
    trainable = {id(p) for _, p in named}
    if set(index) - trainable:
        raise ValueError("param_groups hold a tensor that is not a trainable parameter of the "
                         "model")
    missing = [name for name, p in named if id(p) not in index]
    if missing:
        raise ValueError("param_groups leave out %s" % ", ".join(missing[:5]))
    return groups, [index[id(p)] for _, p in named]
