"""On-demand parameters for strata.torch (`params="on_demand"`, ZeRO-3 style).

Each module that owns trainable parameters is a group: a contiguous range of
the job's flat space. Between uses a parameter's tensor is empty and the
client keeps only this worker's slice of the flat space. Module hooks
gather a group just before its forward and again just before its backward,
with the next group's gather in flight (the next module in registration
order going forward, the previous one going backward), and release it after
its forward and once autograd has accumulated all of its gradients. At most
two groups are materialised or in flight at any time. (A module whose output
is not a tensor or a tuple or list of them keeps its group from its forward
until its gradients are in.)

Releasing frees a group only if autograd did not keep its own reference to
the parameters' storage. torch's linear layer saves a view of its weight
(`weight.t()`), which would keep every layer's weights alive until
backward; so nn.Linear modules run a linear function that saves the weight
itself and computes what torch's does, with the same kernels (bitwise equal
for 2-D inputs and contiguous 3-D ones). The memory figures count the
gathered buffers that are still alive (weak references), not the ones this
module believes it released (copies converted to a non-float32 or non-CPU
parameter are counted while their group is in use).

Every worker must run the same forwards and backwards (the gathers are
collectives started in hook order). Tied parameters (one tensor in two
modules) are not supported.

Not thread-safe: the thread that drives the optimizer runs the hooks.
"""

import types
import weakref

import numpy as np
import torch

# Groups materialised or being gathered at once, at most.
_MAX_GROUPS = 2


class _BeforeBackward(torch.autograd.Function):
    """Identity on a module's outputs; its backward, which autograd runs
    before the module's own, gathers the module's group."""

    @staticmethod
    def forward(ctx, params, group, *outputs):
        ctx.params, ctx.group = params, group
        return tuple(o.detach() for o in outputs)

    @staticmethod
    def backward(ctx, *grads):
        ctx.params.fetch(ctx.group, direction=-1)
        return (None, None) + grads


class _LinearSavingWeight(torch.autograd.Function):
    """torch.nn.functional.linear, saving the weight tensor itself rather
    than a view of it, so that releasing the weight frees its storage and
    gathering it again before backward is what backward reads."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        x2 = x.reshape(-1, x.shape[-1])
        if bias is not None:
            y = torch.addmm(bias, x2, weight.t())
        else:
            y = x2.mm(weight.t())
        return y.view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad):
        # As torch's addmm backward does for a row-major input and a
        # transposed weight (mm_mat1_backward, mm_mat2_backward, sum_to).
        x, weight = ctx.saved_tensors
        grad2 = grad.reshape(-1, grad.shape[-1])
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_x = grad2.mm(weight).view(x.shape)
        if ctx.needs_input_grad[1]:
            grad_weight = grad2.t().mm(x.reshape(-1, x.shape[-1]))
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad2.sum(0, keepdim=True).view(weight.shape[0])
        return grad_x, grad_weight, grad_bias


def _linear_forward(module, x):
    return _LinearSavingWeight.apply(x, module.weight, module.bias)


class _Group:
    def __init__(self, index, params, offsets):
        self.index = index
        self.params = params
        self.shapes = [p.shape for p in params]  # the tensors are empty while released
        self.begin = offsets[0]
        self.end = offsets[-1] + params[-1].numel()
        self.offsets = [o - self.begin for o in offsets]
        self.buffer = None    # float32 array of [begin, end) while gathered (NumPy or CUDA)
        self.copies_bytes = 0  # of parameters converted to another dtype or device
        self.pending = None   # the client's PendingGather until waited for
        self.materialised = False
        self.grads_done = 0

    @property
    def started(self):
        return self.buffer is not None

    def nbytes(self):
        return 4 * (self.end - self.begin)


class OnDemandParams:
    """Gathers and releases `model`'s parameters around their use.

    `named` are the (name, parameter) pairs of the job in flat order and
    `offsets` their flat offsets; `device` is the model's (and the client's):
    gathers land there. ValueError for a tied parameter or a module whose
    parameters are not contiguous in that order."""

    def __init__(self, client, model, named, offsets, device=torch.device("cpu")):
        self._client = client
        self._device = device
        position = {id(p): i for i, (_, p) in enumerate(named)}
        owner = {}
        self._groups = []
        for module_name, module in model.named_modules():
            own = [p for p in module.parameters(recurse=False) if p.requires_grad]
            if not own:
                continue
            indices = [position[id(p)] for p in own]
            for p in own:
                if id(p) in owner:
                    raise ValueError("params=\"on_demand\": module '%s' shares a parameter with "
                                     "module '%s' (tied parameters are not supported)"
                                     % (module_name, owner[id(p)]))
                owner[id(p)] = module_name
            if indices != list(range(indices[0], indices[0] + len(indices))):
                raise ValueError("params=\"on_demand\": the parameters of module '%s' are not "
                                 "contiguous in the model's parameter order" % module_name)
            group = _Group(len(self._groups), own, [offsets[i] for i in indices])
            self._groups.append(group)
            if type(module).forward is torch.nn.Linear.forward:
                module.forward = types.MethodType(_linear_forward, module)
            module.register_forward_pre_hook(
                lambda m, inputs, g=group.index: self.fetch(g, direction=+1))
            module.register_forward_hook(
                lambda m, inputs, output, g=group.index: self._after_forward(g, output))
        # Post hooks of the parameters' gradient accumulators: they run once
        # autograd has written the gradient, when the tensor is free to go.
        self._accumulators = []
        with torch.enable_grad():  # (an optimizer made under no_grad has no grad_fn here)
            for group in self._groups:
                for p in group.params:
                    accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
                    accumulator.register_hook(
                        lambda *unused, g=group.index: self._gradient_accumulated(g))
                    self._accumulators.append(accumulator)
        self._buffers = []  # (weak reference, bytes) of every buffer that may be alive
        self._copies_bytes = 0  # converted copies held by materialised groups
        self.peak_bytes = 0
        self.gathers = 0
        self.prefetched = 0  # gathers that were in flight before their group was needed
        self.release_all()

    @property
    def largest_group_bytes(self):
        return max(g.nbytes() for g in self._groups)

    def fetch(self, index, direction):
        """Makes group `index` usable (gathering it if needed) and starts
        gathering the next one in `direction` if there is room."""
        group = self._groups[index]
        if group.started:
            self.prefetched += group.pending is not None and not group.materialised
        else:
            self._start(group)
        self._materialise(group)
        following = index + direction
        if 0 <= following < len(self._groups) and not self._groups[following].started:
            if sum(g.started for g in self._groups) < _MAX_GROUPS:
                self._start(self._groups[following])

    def release_all(self):
        """Releases every group (parameters change at each step)."""
        for group in self._groups:
            self._release(group)

    def _after_forward(self, index, output):
        if torch.is_grad_enabled():
            output, wrapped = self._wrap_for_backward(index, output)
            if not wrapped:  # kept until its gradients are in, or the step
                return output
        self._release(self._groups[index])
        return output

    def _wrap_for_backward(self, index, output):
        """(output, True) with the tensors that need a gradient passed
        through _BeforeBackward; (output, False) for an output that is not a
        tensor or a tuple or list of them."""
        if isinstance(output, torch.Tensor):
            if output.requires_grad:
                output = _BeforeBackward.apply(self, index, output)[0]
            return output, True
        if not isinstance(output, (tuple, list)):
            return output, False
        where = [i for i, o in enumerate(output) if isinstance(o, torch.Tensor) and o.requires_grad]
        if not where:
            return output, True
        items = list(output)
        for i, wrapped in zip(where, _BeforeBackward.apply(self, index, *[items[i] for i in where])):
            items[i] = wrapped
        return (type(output)(items) if isinstance(output, tuple) else items), True

    def _gradient_accumulated(self, index):
        group = self._groups[index]
        group.grads_done += 1
        if group.grads_done == len(group.params):
            group.grads_done = 0
            self._release(group)

    def _start(self, group):
        n = group.end - group.begin
        if self._device.type == "cpu":
            group.buffer = np.empty(n, dtype=np.float32)
        else:  # gathered on the GPU, in place (__cuda_array_interface__)
            group.buffer = torch.empty(n, dtype=torch.float32, device=self._device)
        self._buffers.append((weakref.ref(group.buffer), group.nbytes()))
        group.pending = self._client.start_gather(group.begin, group.end, group.buffer)
        self.gathers += 1
        self._measure()

    def _materialise(self, group):
        if group.pending is not None:
            group.pending.wait()
            group.pending = None
        if group.materialised:
            return
        flat = (torch.from_numpy(group.buffer) if isinstance(group.buffer, np.ndarray)
                else group.buffer)
        for p, shape, offset in zip(group.params, group.shapes, group.offsets):
            view = flat[offset:offset + shape.numel()].view(shape)
            if p.dtype == torch.float32 and p.device == flat.device:
                p.data = view
            else:
                p.data = view.to(device=p.device, dtype=p.dtype)
                group.copies_bytes += p.data.element_size() * p.numel()
        self._copies_bytes += group.copies_bytes
        group.materialised = True
        self._measure()

    def _release(self, group):
        if group.pending is not None:  # a collective: it must complete everywhere
            group.pending.wait()
            group.pending = None
        if group.started:
            self._measure()  # the group is at its largest: in use, about to go
        for p in group.params:
            if p.numel() > 0:  # also the model's own tensors, at the start
                p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        group.buffer = None
        self._copies_bytes -= group.copies_bytes
        group.copies_bytes = 0
        group.materialised = False
        group.grads_done = 0

    def live_bytes(self):
        """Bytes of gathered parameter storage alive now: float32 buffers
        held by anyone (weak references), plus the copies converted to the
        model's dtype or device of the groups in use."""
        self._buffers = [(ref, n) for ref, n in self._buffers if ref() is not None]
        return sum(n for _, n in self._buffers) + self._copies_bytes

    def _measure(self):
        self.peak_bytes = max(self.peak_bytes, self.live_bytes())
