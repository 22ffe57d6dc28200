"""strata.torch: strata as a torch optimizer.

    import strata.torch
    opt = strata.torch.ShardedOptimizer(model, lr=1e-3, dtype=torch.bfloat16)
    for x, y in my_shard_of_the_data(opt.rank, opt.world_size):
        opt.zero_grad()
        opt.backward(loss_fn(model(x), y))   # or loss.backward()
        opt.step()

The FP32 master weights and the Adam moments live on the shard servers;
each worker holds the whole model in the job's dtype (rounded values in the
model's own parameter tensors) and its gradients -- or, with
params="on_demand", only its slice of the model, each module's parameters
being gathered just before the module runs (see strata.on_demand). step() sends the gradients
(mean over the workers and the accumulated micro-batches, rounded to the
job's dtype and loss-scaled) through strata's client (reduce-scatter, push,
pull, all-gather) and writes the updated parameters into the model.

Run workers with `python3 -m strata.launch --workers N script.py`; the
coordinator, job id and world size then come from the environment (and, for a
coordinator that uses TLS, STRATA_TLS_CA; or pass tls_ca=, tls_cert=, tls_key=;
for one that authenticates callers, STRATA_TOKEN_FILE or token_file=: a file
holding the user's token or the job's worker token). Workers on more than one
host pass collective_host= or set STRATA_COLLECTIVE_HOST (strata.launch
--collective-host): the address of their host that peers reach them on.

Not thread-safe: one thread drives an optimizer (as with any torch one).
"""

import functools
import os
import weakref

import numpy as np
import torch

from strata import _strata
from strata.on_demand import OnDemandParams
from strata.param_groups import groups_of

_DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


class ShardedOptimizer(torch.optim.Optimizer):
    """AdamW (or Adam with `adamw=False`) over `model`'s trainable parameters,
    whose state lives on strata's shard servers.

    One parameter group by default; `param_groups` takes torch's (a list of
    dicts with "params" and optionally "lr" and "weight_decay", e.g. no decay
    on biases and norms), which must hold every trainable parameter once.
    Learning-rate changes through `param_groups[i]["lr"]` (and so any
    torch.optim.lr_scheduler) reach the servers at the next step; betas, eps
    and each group's weight decay are the job's and cannot change (step()
    raises ValueError). Rank 0's model weights initialise a new job; joining an
    existing job (or `restore_from`, a checkpoint directory) takes its weights.

    A model on a CUDA GPU (every trainable parameter on one GPU) keeps the
    client's buffers on that GPU: the workers reduce and gather them with
    NCCL in place (one GPU per worker), and only this worker's slice crosses
    to host memory for the shard servers. An FP32 model's parameters and
    gradients are views of those buffers, on the CPU or the GPU alike: no
    copy per step.

    replicas=2 (or 3) keeps that many copies of each chunk on distinct shard
    servers (a job setting): a server lost for good then costs no step.

    state_precision="int8" has the shard servers store Adam's moments as
    8-bit codes with a scale per 256 parameters (a job setting: 6 bytes of
    state per parameter instead of 12, in host memory or on NVMe; copies
    keep the same bits). Checkpoints and exports read them back in FP32.

    params="replicated" keeps the whole model in every worker (ZeRO-2
    style); params="on_demand" keeps 1/world_size of it and gathers each
    module's parameters around its forward and backward (ZeRO-3 style;
    every worker of the job must use the same; see strata.on_demand).

    stream=True streams the step: in the last micro-batch's backward each
    parameter's gradient goes to the client as soon as backward produced it
    and those after it in the model's order (a gradient hook), and buckets
    of `bucket_params` are reduce-scattered and pushed while backward goes
    on; step() then only commits and pulls. The same weights, bit for bit.
    Run one backward per micro-batch (call step() after each), as the
    gradient of a parameter goes once per step. A streamed backward leaves
    p.grad None: autograd's gradient goes once handed over. Streamed on
    demand, the gradients are sharded too: the client keeps its slice and a
    few buckets (param_memory()).

    param_sync="per_module" (replicated only) lets step() return before the
    new parameters are in the model: each module's own parameters are
    written into it just before its forward (a forward pre-hook), once the
    all-gather, which goes on in layout order, has brought them; so the next
    forward waits only for the layer it is about to run. Until a module's
    forward (or a synchronization) its parameters keep the previous step's
    values: call synchronize() before reading parameters outside the
    model's forward (an EMA, logging, a forward that uses another module's
    parameters without calling it). model.state_dict(), step() and leave()
    synchronize first. A worker lost during the all-gather then raises its
    StrataError from the forward that writes the parameters, not from
    step(). "eager" (the default) writes every parameter before step()
    returns.
    """

    def __init__(self, model, coordinator=None, job=None, lr=1e-3, betas=(0.9, 0.999),
                 eps=1e-8, weight_decay=0.0, dtype=torch.float16, loss_scale="dynamic",
                 max_grad_norm=0.0, accumulation_steps=1, adamw=True, world_size=None,
                 worker_id=None, chunk_params=1 << 22, restore_from="", timeout_s=60.0,
                 params="replicated", tls_ca=None, tls_cert=None, tls_key=None,
                 token_file=None, stream=False, bucket_params=1 << 20, param_groups=None,
                 replicas=1, collective_host=None, state_precision="fp32",
                 param_sync="eager"):
        if dtype not in _DTYPE_NAMES:
            raise ValueError("dtype must be torch.float16, torch.bfloat16 or torch.float32, "
                             "not %s" % (dtype,))
        if params not in ("replicated", "on_demand"):
            raise ValueError('params must be "replicated" or "on_demand", not %r' % (params,))
        if param_sync not in ("eager", "per_module"):
            raise ValueError('param_sync must be "eager" or "per_module", not %r' % (param_sync,))
        if param_sync == "per_module" and params != "replicated":
            raise ValueError('param_sync="per_module" needs params="replicated" (on demand, each '
                             "module gathers its parameters before it runs anyway)")
        if accumulation_steps < 1:
            raise ValueError("accumulation_steps must be >= 1, not %s" % accumulation_steps)
        coordinator = coordinator or os.environ.get("STRATA_COORDINATOR", "127.0.0.1:7700")
        job = job or os.environ.get("STRATA_JOB")
        if not job:
            raise ValueError("no job: pass job= or run under `python3 -m strata.launch`")
        world_size = world_size or int(os.environ.get("STRATA_WORLD_SIZE", "1"))
        worker_id = worker_id or os.environ.get("STRATA_WORKER_ID", "")
        tls_ca = tls_ca or os.environ.get("STRATA_TLS_CA", "")
        tls_cert = tls_cert or os.environ.get("STRATA_TLS_CERT", "")
        tls_key = tls_key or os.environ.get("STRATA_TLS_KEY", "")
        token_file = token_file or os.environ.get("STRATA_TOKEN_FILE", "")
        collective_host = collective_host or os.environ.get("STRATA_COLLECTIVE_HOST",
                                                            "127.0.0.1")

        named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        if not named:
            raise ValueError("the model has no trainable parameters")
        self._device = _device_of(named)
        groups, tensor_groups = groups_of(named, param_groups)
        super().__init__(groups, dict(lr=lr, betas=tuple(betas), eps=eps,
                                      weight_decay=weight_decay))
        for group in self.param_groups:
            if tuple(group["betas"]) != tuple(betas) or group["eps"] != eps:
                raise ValueError("betas and eps are the job's: every group must have the "
                                 "optimizer's (%s, %s)" % (tuple(betas), eps))
        self._grouped = param_groups is not None
        self._hyper = [dict(betas=tuple(betas), eps=eps, weight_decay=group["weight_decay"])
                       for group in self.param_groups]
        self._accumulation_steps = accumulation_steps
        self._micro_batches = 0
        self.last_result = None

        tensors = [(name, list(p.shape)) for name, p in named]
        self._shapes = {name: p.shape for name, p in named}
        self._job_dtype_bytes = 4 if dtype == torch.float32 else 2
        offsets, num_params = _strata.flat_layout(tensors, chunk_params)
        self._names = [name for name, _ in named]
        self._params = [p for _, p in named]
        self._offsets = offsets
        self._num_params = num_params
        self._flat = torch.zeros(num_params, dtype=torch.float32, device=self._device)
        self._views = [self._flat[o:o + p.numel()].view(p.shape)
                       for o, p in zip(offsets, self._params)]
        # The FP32 flat gradient that micro-batches go through when not
        # streamed; made at first use.
        self._grad_flat = self._grad_views = None
        with torch.no_grad():
            for view, p in zip(self._views, self._params):
                view.copy_(p.detach().float())
        # An FP32 model keeps its parameters and gradients in the flat
        # buffers the client reads and writes on the model's device (no
        # copies); others are copied in and out.
        self._in_place = params == "replicated" and all(
            p.dtype == torch.float32 for p in self._params)
        self._stream = stream
        if self._in_place:
            self._make_grad_flat()
            for p, view in zip(self._params, self._views):
                p.data = view
            self._prepare_grads()
        # Set by a hook when backward reaches a parameter: gradients wait.
        self._grads_pending = [False]
        self._backward_scaled = False  # in backward(): the loss is scaled
        self._streamed = False  # this micro-batch's gradients went to the client
        self._held = {}  # streamed gradients by parameter index, awaiting their turn
        self._next_handover = len(self._params) - 1
        self.streamed_micro_batches = 0  # micro-batches handed over during backward
        weak_self = weakref.ref(self)  # the model's hooks do not keep the optimizer
        for index, p in enumerate(self._params):
            p.register_hook(functools.partial(_on_gradient, weak_self, index))
        # Streamed, a gradient autograd accumulated goes once handed over
        # (post hooks of the accumulators, which this list keeps alive).
        self._accumulators = []
        if stream:
            with torch.enable_grad():
                for p in self._params:
                    accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
                    accumulator.register_hook(functools.partial(_on_accumulated, weak_self, p))
                    self._accumulators.append(accumulator)
        self._client = _strata.connect(
            coordinator=coordinator, job=job, worker_id=worker_id, tensors=tensors,
            world_size=world_size, chunk_params=chunk_params, lr=lr, betas=tuple(betas), eps=eps,
            weight_decay=weight_decay, adamw=adamw, dtype=_DTYPE_NAMES[dtype], params=params,
            loss_scale=loss_scale, max_grad_norm=max_grad_norm,
            initial_params=None if restore_from else self._flat.cpu().numpy(),
            restore_from=restore_from,
            timeout_s=timeout_s, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key,
            token_file=token_file, collective_host=collective_host, bucket_params=bucket_params,
            tensor_groups=tensor_groups if self._grouped else [], replicas=replicas,
            group_weight_decays=([float(group["weight_decay"]) for group in self.param_groups]
                                 if self._grouped else []),
            device=_device_name(self._device), state_precision=state_precision)
        self._on_demand = None
        if params == "on_demand":
            self._flat = self._views = None  # the model's copy goes; gathers bring it back
            self._on_demand = OnDemandParams(self._client, model, named, offsets, self._device)
        self._pull_into_model()
        # param_sync="per_module": whether each parameter still holds the
        # previous step's values (None: eager).
        self._stale = None
        if param_sync == "per_module":
            self._stale = [False] * len(self._params)
            _hook_modules(model, self._params, weak_self)

    # Where this worker stands in the job's current generation.
    @property
    def rank(self):
        return self._client.rank

    @property
    def world_size(self):
        return self._client.world_size

    @property
    def step_count(self):
        """The last step the servers applied (0 before the first)."""
        return self._client.applied_step

    @property
    def loss_scale(self):
        return self._client.loss_scale

    @property
    def last_reform(self):
        """How the workers' group last formed (at start or when a worker came
        or went): dict of count, generation, seconds, param_pull_seconds and
        steps_lost -- the completed steps undone when the job resumed from its
        last checkpoint after losing a shard server (step_count goes back)."""
        return self._client.last_reform

    def param_memory(self):
        """Parameter memory of this worker, in bytes: `resident` (the
        client's parameters between steps: the model, or its slice on
        demand), `model` (the whole model in the job's dtype) and, on
        demand, `peak_gathered` (the most gathered parameter storage alive
        at once), `largest_group`, `gathers` and `prefetched` (gathers
        already in flight when their module needed them). Gradients beside
        them: `peak_grad`, the most the client held at once (the model's,
        or on demand its slice and the streamed buckets in flight: sharded),
        and `grad_staging`, the FP32 flat gradient of unstreamed
        micro-batches (0 when every micro-batch streamed)."""
        memory = dict(resident=self._client.resident_param_bytes,
                      model=self._client.num_params * self._job_dtype_bytes,
                      peak_grad=self._client.peak_grad_bytes,
                      grad_staging=(0 if self._grad_flat is None else
                                    self._grad_flat.numel() * self._grad_flat.element_size()))
        if self._on_demand is not None:
            memory.update(peak_gathered=self._on_demand.peak_bytes,
                          largest_group=self._on_demand.largest_group_bytes,
                          gathers=self._on_demand.gathers, prefetched=self._on_demand.prefetched)
        return memory

    def zero_grad(self, set_to_none=True):
        """Drops gradients not yet taken by backward() or step()."""
        if self._in_place:
            if self._grads_pending[0]:  # else _accumulate() left the buffer zero
                self._grad_flat.zero_()
            self._prepare_grads()
        else:
            for p in self._params:
                if set_to_none:
                    p.grad = None
                elif p.grad is not None:
                    p.grad.zero_()
        self._grads_pending[0] = False

    def backward(self, loss):
        """loss.backward() with the loss multiplied by the loss scale (which
        keeps FP16 gradients of an FP16 model from underflowing); the
        gradients are taken into this step's accumulator."""
        self._backward_scaled = True
        try:
            (loss * self._client.loss_scale).backward()
        finally:
            self._backward_scaled = False
        self._accumulate(scaled=True)

    @torch.no_grad()
    def step(self, closure=None):
        """Takes the gradients in the model (from loss.backward() or
        backward()) as one micro-batch; once `accumulation_steps` of them are
        in, runs one strata step and writes the new parameters into the
        model. Returns the closure's loss, if any. `last_result` holds the
        last step's figures (step, skipped, grad_norm, loss_scale, seconds)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._accumulate(scaled=False)
        if self._micro_batches < self._accumulation_steps:
            return loss
        for group, hyper in zip(self.param_groups, self._hyper):
            for key, value in hyper.items():
                got = tuple(group[key]) if key == "betas" else group[key]
                if got != value:
                    raise ValueError("%s is %s for this job; only lr can change (got %s)"
                                     % (key, value, got))
        if self._grouped:
            self._client.set_group_learning_rates([float(g["lr"]) for g in self.param_groups])
        else:
            self._client.set_learning_rate(float(self.param_groups[0]["lr"]))
        self._micro_batches = 0
        if self._on_demand is not None:  # the step changes every parameter
            self._on_demand.release_all()
        self.synchronize()  # the client's step replaces the parameters it holds
        self.last_result = self._client.step()
        if self._stale is None:
            self._pull_into_model()
        else:  # written module by module as the next forward reaches them
            self._stale = [True] * len(self._params)
        self._prepare_grads()
        return loss

    @torch.no_grad()
    def synchronize(self):
        """With param_sync="per_module": writes into the model every
        parameter that still holds the previous step's values (waiting for
        the all-gather). Nothing to do otherwise."""
        if self._stale is not None:
            self._write_params(range(len(self._params)))

    @torch.no_grad()
    def _write_params(self, indices):
        """Writes the stale parameters among `indices` (ascending) into the
        model: one gather per run of consecutive ones, waiting only for the
        all-gather to reach its end."""
        stale = [i for i in indices if self._stale[i]]
        while stale:
            length = 1
            while length < len(stale) and stale[length] == stale[length - 1] + 1:
                length += 1
            run, stale = stale[:length], stale[length:]
            begin = self._offsets[run[0]]
            end = self._offsets[run[-1]] + self._params[run[-1]].numel()
            self._client.start_gather(begin, end, _buffer(self._flat[begin:end])).wait()
            for i in run:
                if not self._in_place:
                    self._params[i].copy_(self._views[i])
                self._stale[i] = False

    def state_dict(self):
        """The client side: hyper-parameters and lr (param_groups), step,
        loss scale. The weights and moments are the servers' (checkpoints)."""
        state = super().state_dict()
        state["strata"] = dict(step=self._client.applied_step, loss_scale=self._client.loss_scale,
                               loss_scale_good_steps=self._client.loss_scale_good_steps)
        return state

    def load_state_dict(self, state_dict):
        """Restores what state_dict() saved. ValueError when the servers'
        job is at another step than the saved one (restore the matching
        checkpoint with restore_from=)."""
        strata_state = state_dict["strata"]
        if strata_state["step"] != self._client.applied_step:
            raise ValueError("the saved optimizer state is of step %d; the job is at step %d"
                             % (strata_state["step"], self._client.applied_step))
        super().load_state_dict({k: v for k, v in state_dict.items() if k != "strata"})
        self._client.restore_loss_scale(strata_state["loss_scale"],
                                        strata_state["loss_scale_good_steps"])

    def all_reduce_sum(self, values):
        """Sums a list of floats over the workers (losses, sample counts)."""
        array = np.asarray(values, dtype=np.float64).copy()
        self._client.all_reduce_sum(array)
        return array.tolist()

    def master_state(self):
        """{name: (p, exp_avg, exp_avg_sq)} FP32 tensors read from the servers."""
        _, *flat_state = self._client.read_master_state()
        out = {}
        for name, p, begin in zip(self._names, self._params, self._offsets):
            shape = self._shapes[name]
            size = int(np.prod(shape, dtype=np.int64))
            out[name] = tuple(torch.from_numpy(a[begin:begin + size].copy()).view(shape)
                              for a in flat_state)
        return out

    def announce_leave(self):
        """This worker leaves after its next step: the others hear of it in
        that step and re-form without it once leave() is called, with no
        step of theirs cut short."""
        self._client.announce_leave()

    def leave(self):
        """Leaves the job at a step boundary; the other workers go on
        (without announce_leave() first, their step under way is computed
        again, as after a lost worker)."""
        self.synchronize()
        self._client.leave()

    @torch.no_grad()
    def _accumulate(self, scaled):
        """Hands the gradients in the model to the client as one micro-batch
        (if backward ran since the last one); `scaled`: they are of the loss
        multiplied by the loss scale."""
        if not self._grads_pending[0]:
            return
        self._grads_pending[0] = False
        if self._streamed:  # the hooks handed the gradients over already
            self._flush_streamed()
            self._streamed = False
            self._micro_batches += 1
            self.streamed_micro_batches += 1
            if self._in_place:  # autograd's went once handed over: the buffer is zero
                self._prepare_grads()
            else:
                for p in self._params:
                    p.grad = None
            return
        self._make_grad_flat()
        for p, view in zip(self._params, self._grad_views):
            if p.grad is None:
                view.zero_()
            elif p.grad.data_ptr() != view.data_ptr():  # not in place, or replaced
                view.copy_(p.grad)
            if not self._in_place:
                p.grad = None
        self._client.accumulate_gradients(_buffer(self._grad_flat), scaled=scaled)
        self._micro_batches += 1
        if self._in_place:  # backward adds into the buffer: clear it for the next
            self._grad_flat.zero_()
            self._prepare_grads()

    def _streaming(self):
        """This backward is the last micro-batch's of a streamed step."""
        return self._stream and self._micro_batches + 1 >= self._accumulation_steps

    def _stream_gradient(self, index, grad):
        """In the last micro-batch's backward: hands parameter `index`'s
        gradient to the client (which pushes its buckets as they complete),
        in reverse parameter order: one that backward gives early (a
        layer's weight before its bias) waits for those after it, so that
        the client's buckets complete, and go, one after another."""
        if not self._streaming():
            return
        self._streamed = True
        self._held[index] = grad.detach()
        while self._next_handover in self._held:
            self._hand_over(self._next_handover)
            self._next_handover -= 1

    def _flush_streamed(self):
        """At step(): hands over the gradients still held (those after them
        got none: they stay zero)."""
        for index in sorted(self._held, reverse=True):
            self._hand_over(index)
        self._next_handover = len(self._params) - 1

    def _hand_over(self, index):
        g = self._held.pop(index)
        if g.dtype != torch.float32 or g.device != self._device:
            g = g.to(device=self._device, dtype=torch.float32)
        self._client.gradients_ready(self._offsets[index], _buffer(g.contiguous().view(-1)),
                                     scaled=self._backward_scaled)

    def _make_grad_flat(self):
        if self._grad_flat is None:
            self._grad_flat = torch.zeros(self._num_params, dtype=torch.float32,
                                          device=self._device)
            self._grad_views = [
                self._grad_flat[o:o + self._shapes[name].numel()].view(self._shapes[name])
                for o, name in zip(self._offsets, self._names)]

    def _prepare_grads(self):
        """In place, autograd accumulates the next backward's gradients into
        the flat buffer's views -- unless that backward streams: its
        gradients go to the hooks, and p.grad stays None."""
        if not self._in_place:
            return
        streaming = self._streaming()
        for p, view in zip(self._params, self._grad_views):
            if streaming:
                p.grad = None
            elif p.grad is None or p.grad.data_ptr() != view.data_ptr():
                p.grad = view

    @torch.no_grad()
    def _pull_into_model(self):
        if self._on_demand is not None:
            return  # gathered when used
        self._client.copy_params(_buffer(self._flat))
        if not self._in_place:
            for p, view in zip(self._params, self._views):
                p.copy_(view)


def _device_of(named):
    """The one device (CPU or a CUDA GPU) of the model's trainable parameters."""
    devices = {p.device for _, p in named}
    if len(devices) != 1:
        raise ValueError("the model's parameters are on %s: strata trains a model on one device"
                         % ", ".join(sorted(str(d) for d in devices)))
    device = devices.pop()
    if device.type not in ("cpu", "cuda"):
        raise ValueError("the model is on %s: strata trains on the CPU or a CUDA GPU" % device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def _device_name(device):
    """The client's name of `device`: "cpu" or "cuda:N"."""
    return "cpu" if device.type == "cpu" else "cuda:%d" % device.index


def _buffer(tensor):
    """A flat FP32 tensor as the client takes it: a NumPy view of CPU memory,
    or the CUDA tensor itself (__cuda_array_interface__), read and written in
    place on the GPU."""
    return tensor.numpy() if tensor.device.type == "cpu" else tensor


def _hook_modules(model, params, weak_optimizer):
    """param_sync="per_module": a forward pre-hook on every module that owns
    trainable parameters writes them before it runs, and a hook on the
    model's state_dict() synchronizes."""
    position = {id(p): i for i, p in enumerate(params)}
    for module in model.modules():
        own = sorted(position[id(p)] for p in module.parameters(recurse=False)
                     if id(p) in position)
        if own:
            module.register_forward_pre_hook(
                functools.partial(_before_forward, weak_optimizer, own))
    model._register_state_dict_hook(functools.partial(_on_state_dict, weak_optimizer))


def _before_forward(weak_optimizer, indices, *unused):
    optimizer = weak_optimizer()
    if optimizer is not None:
        optimizer._write_params(indices)


def _on_state_dict(weak_optimizer, *unused):
    """Runs once state_dict() has collected the parameters: they share
    storage with the model's, so writing those completes the dict."""
    optimizer = weak_optimizer()
    if optimizer is not None:
        optimizer.synchronize()


def _on_accumulated(weak_optimizer, p, *unused):
    """A post hook of `p`'s gradient accumulator: a streamed gradient goes
    once handed over, so that gradients do not pile up during backward."""
    optimizer = weak_optimizer()
    if optimizer is not None and optimizer._streaming():
        p.grad = None


def _on_gradient(weak_optimizer, index, grad):
    """A parameter's gradient hook: backward reached it."""
    optimizer = weak_optimizer()
    if optimizer is not None:
        optimizer._grads_pending[0] = True
        optimizer._stream_gradient(index, grad)
