"""Tests of strata.torch: 2 workers launched by strata.launch (with its local
cluster) train examples/torch_digits.py; the reference is torch.optim.AdamW
in this process on the whole batch, with the same data, model and schedule.

Run by ctest (tests/CMakeLists.txt), or:
    PYTHONPATH=build/python STRATA_BIN=build/bin python3 -m unittest tests/python/torch_test.py
"""

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import unittest

import torch

import strata
import strata.launch
import strata.torch
from strata.torch import _DTYPE_NAMES
from strata.cluster import LocalCluster

SOURCE_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
EXAMPLE = os.path.join(SOURCE_DIR, "examples", "torch_digits.py")


def load_example():
    spec = importlib.util.spec_from_file_location("torch_digits", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


digits = load_example()


def launch(workers, *example_args):
    """Runs the example in `workers` processes on a fresh local cluster."""
    subprocess.run([sys.executable, "-m", "strata.launch", "--workers", str(workers), EXAMPLE,
                    "--log-every", "1000000"] + list(example_args),
                   check=True, timeout=600)


def torch_reference(steps, batch, lr, weight_decay, schedule, param_groups=False):
    """The same training, one process, whole batches, torch.optim.AdamW."""
    torch.set_num_threads(1)
    x_train, y_train, _, _ = digits.load_data()
    model = digits.make_model()
    params = (digits.make_param_groups(model, lr, weight_decay) if param_groups
              else model.parameters())
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    scheduler = digits.make_schedule(opt, schedule, steps)
    for step in range(1, steps + 1):
        batch_idx = digits.batch_indices(step, batch, len(x_train))
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x_train[batch_idx]), y_train[batch_idx]).backward()
        opt.step()
        if scheduler is not None:
            scheduler.step()
    return dict(model.named_parameters())


def max_relative_error(got, want):
    """The worst tensor's relative error ||got - want|| / ||want||. (Element
    by element, float rounding grows chaotically through 50 Adam steps of a
    ReLU network: torch itself, summing the same gradient in two halves,
    ends 9e-6 * max|w| away from its whole-batch run.)"""
    return max(((got[name] - want[name]).norm() / want[name].norm()).item() for name in want)


class EquivalenceTest(unittest.TestCase):
    def train_and_compare(self, schedule, param_groups=False):
        with tempfile.TemporaryDirectory() as tmp:
            weights = os.path.join(tmp, "weights.pt")
            launch(2, "--dtype", "fp32", "--steps", "50", "--batch", "128", "--lr", "2e-3",
                   "--weight-decay", "0.01", "--schedule", schedule, "--save-weights", weights,
                   *(["--param-groups"] if param_groups else []))
            got = torch.load(weights)
        want = torch_reference(50, 128, 2e-3, 0.01, schedule, param_groups)
        self.assertEqual(sorted(got), sorted(want))
        error = max_relative_error(got, want)
        print("%s: max relative error %.3g" % (schedule, error))
        self.assertLessEqual(error, 1e-5)
        return got

    def test_fp32_two_workers_equal_torch_adamw_on_the_whole_batch(self):
        self.train_and_compare("none")

    def test_lr_scheduler_changes_reach_the_servers(self):
        scheduled = self.train_and_compare("warmup-cosine")
        # The schedule matters: constant-lr AdamW ends far from it.
        constant = torch_reference(50, 128, 2e-3, 0.01, "none")
        self.assertGreater(max_relative_error(scheduled, constant), 1e-2)

    def test_parameter_groups_equal_torch_adamw_with_the_same_groups(self):
        """Weights with decay, biases without and at half the rate, under a
        schedule that scales both groups' rates."""
        grouped = self.train_and_compare("warmup-cosine", param_groups=True)
        # The groups matter: one group ends far from them.
        ungrouped = torch_reference(50, 128, 2e-3, 0.01, "warmup-cosine")
        self.assertGreater(max_relative_error(grouped, ungrouped), 1e-3)


class LowPrecisionTest(unittest.TestCase):
    """FP16 and BF16 follow the FP32 run: the mean loss of every window of 25
    steps within 0.05 (nats) of FP32's, and held-out accuracy within 1 point."""

    STEPS = 300

    def run_dtype(self, dtype, tmp):
        out = os.path.join(tmp, dtype + ".json")
        launch(2, "--dtype", dtype, "--steps", str(self.STEPS), "--out", out)
        with open(out) as f:
            return json.load(f)

    def test_fp16_and_bf16_follow_fp32(self):
        with tempfile.TemporaryDirectory() as tmp:
            runs = {dtype: self.run_dtype(dtype, tmp) for dtype in ("fp32", "fp16", "bf16")}

        def windows(losses):
            losses = losses[-self.STEPS:]  # a skipped (overflow) step is logged twice
            return [sum(losses[i:i + 25]) / 25 for i in range(0, self.STEPS, 25)]
        fp32 = windows(runs["fp32"]["losses"])
        self.assertLess(fp32[-1], 0.5 * fp32[0])  # it learns
        for dtype in ("fp16", "bf16"):
            got = windows(runs[dtype]["losses"])
            worst = max(abs(a - b) for a, b in zip(got, fp32))
            accuracy_gap = abs(runs[dtype]["held_out_accuracy"] - runs["fp32"]["held_out_accuracy"])
            print("%s: worst window loss gap %.4f, accuracy %.4f vs %.4f" % (
                dtype, worst, runs[dtype]["held_out_accuracy"], runs["fp32"]["held_out_accuracy"]))
            self.assertLessEqual(worst, 0.05, dtype)
            self.assertLessEqual(accuracy_gap, 0.01, dtype)


class Int8StateTest(unittest.TestCase):
    """Adam's moments stored 8-bit on the shard servers (state_precision
    "int8") train the digits as FP32 moments do: held-out accuracy within 1
    point, final loss (mean of the last 25 steps) within 5%."""

    STEPS = 300

    def run_state(self, state, tmp):
        out = os.path.join(tmp, state + ".json")
        launch(2, "--dtype", "fp32", "--state-precision", state, "--steps", str(self.STEPS),
               "--out", out)
        with open(out) as f:
            return json.load(f)

    def test_int8_moments_follow_fp32(self):
        with tempfile.TemporaryDirectory() as tmp:
            runs = {state: self.run_state(state, tmp) for state in ("fp32", "int8")}
        final = {state: sum(run["losses"][-25:]) / 25 for state, run in runs.items()}
        accuracy = {state: run["held_out_accuracy"] for state, run in runs.items()}
        print("final loss %.4f (int8) vs %.4f (fp32), accuracy %.4f vs %.4f" % (
            final["int8"], final["fp32"], accuracy["int8"], accuracy["fp32"]))
        self.assertNotEqual(runs["int8"]["losses"], runs["fp32"]["losses"])  # int8 took effect
        self.assertLessEqual(abs(final["int8"] - final["fp32"]), 0.05 * final["fp32"])
        self.assertLessEqual(abs(accuracy["int8"] - accuracy["fp32"]), 0.01)


class OnDemandTest(unittest.TestCase):
    """params="on_demand" (each worker keeps half the model and gathers each
    layer around its forward and backward) trains, bit for bit, like
    replicated parameters, with at most two layers gathered at a time."""

    def run_mode(self, tmp, dtype, params):
        out = os.path.join(tmp, "%s-%s.json" % (dtype, params))
        weights = os.path.join(tmp, "%s-%s.pt" % (dtype, params))
        launch(2, "--dtype", dtype, "--steps", "30", "--params", params, "--out", out,
               "--save-weights", weights)
        with open(out) as f:
            return json.load(f), torch.load(weights)

    def test_on_demand_equals_replicated_bitwise_within_the_memory_bound(self):
        for dtype, element_bytes in (("fp32", 4), ("bf16", 2)):
            with tempfile.TemporaryDirectory() as tmp:
                replicated, want = self.run_mode(tmp, dtype, "replicated")
                on_demand, got = self.run_mode(tmp, dtype, "on_demand")
            self.assertEqual(sorted(got), sorted(want))
            for name in want:
                self.assertTrue(torch.equal(got[name], want[name]), (dtype, name))
            self.assertEqual(on_demand["losses"], replicated["losses"], dtype)
            self.assertFalse(torch.equal(want["0.weight"], digits.make_model().state_dict()[
                "0.weight"]))  # it trained
            memory = on_demand["param_memory"]
            print("%s on demand: %s; replicated: %s" % (dtype, memory,
                                                       replicated["param_memory"]))
            # 1/W of the model (slices are whole multiples of 64 parameters)...
            self.assertLessEqual(memory["resident"], memory["model"] / 2 + 64 * element_bytes)
            self.assertGreaterEqual(replicated["param_memory"]["resident"], memory["model"])
            # ... plus at most two layers gathered (float32) at any time.
            self.assertLessEqual(memory["peak_gathered"], 2 * memory["largest_group"])
            self.assertGreater(memory["peak_gathered"], memory["largest_group"])
            # Forward and backward each gather the three layers every step
            # (then the held-out evaluation); all but the first of each pass
            # were in flight before they were needed.
            self.assertEqual(memory["gathers"], 30 * 6 + 3)
            self.assertEqual(memory["prefetched"], 30 * 4 + 2)


    def test_linear_saving_its_weight_equals_torch_linear_bitwise(self):
        from strata.on_demand import _LinearSavingWeight
        torch.manual_seed(1)
        for shape in [(32, 64), (4, 8, 64), (1, 64)]:
            for bias in (True, False):
                linear = torch.nn.Linear(64, 48, bias=bias)
                x = torch.randn(*shape, requires_grad=True)
                y = linear(x)
                grad = torch.randn_like(y)
                y.backward(grad)
                want = [y, x.grad, linear.weight.grad] + ([linear.bias.grad] if bias else [])
                want = [t.detach().clone() for t in want]
                x.grad = None
                linear.zero_grad()
                y = _LinearSavingWeight.apply(x, linear.weight, linear.bias)
                y.backward(grad)
                got = [y.detach(), x.grad, linear.weight.grad] + (
                    [linear.bias.grad] if bias else [])
                for i, (a, b) in enumerate(zip(got, want)):
                    self.assertTrue(torch.equal(a, b), (shape, bias, i))


class StreamedTest(unittest.TestCase):
    """stream=True (gradients handed over by hooks during backward, buckets
    pushed as they complete) trains, bit for bit, like the unstreamed step:
    replicated FP32 and BF16, and on demand, where the gradients are
    sharded too."""

    def train(self, tmp, name, *args):
        out = os.path.join(tmp, name + ".json")
        weights = os.path.join(tmp, name + ".pt")
        launch(2, "--steps", "20", "--out", out, "--save-weights", weights, *args)
        with open(out) as f:
            return json.load(f), torch.load(weights)

    def test_streamed_equals_unstreamed_bitwise(self):
        for dtype, params in (("fp32", "replicated"), ("bf16", "replicated"),
                              ("bf16", "on_demand")):
            with tempfile.TemporaryDirectory() as tmp:
                plain, want = self.train(tmp, "plain", "--dtype", dtype)
                streamed, got = self.train(tmp, "streamed", "--dtype", dtype, "--params", params,
                                         "--stream", "--bucket-params", "1024")
            self.assertEqual(sorted(got), sorted(want))
            for name in want:
                self.assertTrue(torch.equal(got[name], want[name]), (dtype, params, name))
            self.assertEqual(streamed["losses"], plain["losses"], (dtype, params))
            self.assertEqual(streamed["streamed_micro_batches"], 20)
            self.assertEqual(plain["streamed_micro_batches"], 0)
            memory = streamed["param_memory"]
            print("%s %s streamed: %s" % (dtype, params, memory))
            self.assertGreaterEqual(plain["param_memory"]["peak_grad"], memory["model"])
            if params == "on_demand":  # the slice and at most 4 buckets
                self.assertEqual(memory["grad_staging"], 0)
                self.assertLessEqual(memory["peak_grad"], memory["resident"] + 4 * 1024 * 2)
                self.assertLess(memory["peak_grad"], memory["model"])
            self.assertFalse(torch.equal(want["0.weight"], digits.make_model().state_dict()[
                "0.weight"]))  # it trained


class ClusterTestCase(unittest.TestCase):
    """Tests of workers in this process against one local cluster of two
    shard servers, shared by the class's tests."""

    @classmethod
    def setUpClass(cls):
        cls.cluster = LocalCluster(servers=2)
        cls.cluster.__enter__()

    @classmethod
    def tearDownClass(cls):
        cls.cluster.__exit__(None, None, None)


class OptimizerApiTest(ClusterTestCase):
    """One worker in this process against a local cluster."""

    def optimizer(self, model, job, **kwargs):
        return strata.torch.ShardedOptimizer(model, coordinator=self.cluster.coordinator, job=job,
                                             world_size=1, **kwargs)

    @staticmethod
    def train(opt, model, steps):
        """`steps` steps of `model` on the first 32 digits."""
        x, y, _, _ = digits.load_data()
        for _ in range(steps):
            opt.zero_grad()
            opt.backward(torch.nn.functional.cross_entropy(model(x[:32]), y[:32]))
            opt.step()

    def test_an_fp32_step_copies_no_tensor_in_python(self):
        """An FP32 CPU model's parameters and gradients stay in the client's
        flat buffers across steps; streamed, each gradient reaches the client
        from where backward left it (the same data pointer) and is not kept."""
        for stream in (False, True):
            model = digits.make_model(hidden=16)
            opt = self.optimizer(model, "no-copy-%s" % stream, dtype=torch.float32,
                                 stream=stream, bucket_params=256)

            class Recording:  # the client, recording where streamed gradients lie
                def __init__(self, client):
                    self.client, self.pointers = client, []

                def gradients_ready(self, begin, grads, scaled):
                    self.pointers.append(grads.ctypes.data)
                    return self.client.gradients_ready(begin, grads, scaled=scaled)

                def __getattr__(self, name):
                    return getattr(self.client, name)

            recording = Recording(opt._client)
            opt._client = recording
            seen = []  # where backward left each gradient (hooks run in order)
            for p in model.parameters():
                p.register_hook(lambda grad: seen.append(grad.data_ptr()))

            def inside(tensor, flat):
                begin = flat.data_ptr()
                return begin <= tensor.data_ptr() < begin + flat.numel() * flat.element_size()

            before = [p.data_ptr() for p in model.parameters()]
            self.train(opt, model, 3)
            self.assertEqual(opt.step_count, 3)
            self.assertEqual([p.data_ptr() for p in model.parameters()], before)
            for p in model.parameters():
                self.assertTrue(inside(p, opt._flat))
                if stream:  # handed over from where backward left them, then dropped
                    self.assertIsNone(p.grad)
                else:
                    self.assertTrue(inside(p.grad, opt._grad_flat))
            if stream:
                self.assertEqual(opt.streamed_micro_batches, 3)
                self.assertEqual(len(recording.pointers), 3 * len(before))
                self.assertEqual(recording.pointers, seen)
            else:
                self.assertEqual(recording.pointers, [])

    def test_per_module_param_sync_equals_eager_bitwise(self):
        """param_sync="per_module": after step() a module's parameters keep
        the previous step's values until its forward runs, then hold what an
        eager optimizer wrote, bit for bit; a module no forward runs (an
        unused head, moved by weight decay) gets them at state_dict()."""
        x, y, _, _ = digits.load_data()

        class WithUnusedHead(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.body = digits.make_model(hidden=16)
                self.unused = torch.nn.Linear(4, 4)

            def forward(self, inputs):
                return self.body(inputs)

        for model_dtype, job_dtype, stream in ((torch.float32, torch.float32, False),
                                               (torch.float32, torch.bfloat16, True),
                                               (torch.bfloat16, torch.bfloat16, False)):
            case = "%s-%s-%s" % (_DTYPE_NAMES[model_dtype], _DTYPE_NAMES[job_dtype], stream)
            models = [WithUnusedHead().to(model_dtype) for _ in range(2)]
            eager, lazy = [self.optimizer(model, "sync-%s-%s" % (sync, case), dtype=job_dtype,
                                          lr=1e-2, weight_decay=0.5, stream=stream,
                                          param_sync=sync)
                           for model, sync in zip(models, ("eager", "per_module"))]
            inputs = x[:32].to(model_dtype)
            for step in range(3):
                before = {name: p.detach().clone() for name, p in models[1].named_parameters()}
                losses = []
                for opt, model in ((eager, models[0]), (lazy, models[1])):
                    opt.zero_grad()
                    loss = torch.nn.functional.cross_entropy(model(inputs).float(), y[:32])
                    opt.backward(loss)
                    opt.step()
                    losses.append(loss.item())
                self.assertEqual(losses[0], losses[1], (case, step))
                want = dict(models[0].named_parameters())
                for name, p in models[1].named_parameters():  # the previous step's
                    self.assertTrue(torch.equal(p, before[name]), (case, step, name))
                    self.assertFalse(torch.equal(p, want[name]), (case, step, name))
                with torch.no_grad():
                    models[1](inputs[:1])  # writes the body's, not the head's
                for name, p in models[1].named_parameters():
                    expected = want[name] if name.startswith("body.") else before[name]
                    self.assertTrue(torch.equal(p, expected), (case, step, name))
                got = models[1].state_dict()  # writes the rest
                for name, value in models[0].state_dict().items():
                    self.assertTrue(torch.equal(got[name], value), (case, step, name))
                    self.assertTrue(torch.equal(dict(models[1].named_parameters())[name], value))

    def test_state_dict_round_trip_and_mismatches(self):
        model = digits.make_model(hidden=16)
        opt = self.optimizer(model, "state-dict", dtype=torch.float16, lr=1e-3)
        self.train(opt, model, 3)
        self.assertEqual(opt.step_count, 3)
        self.assertFalse(opt.last_result["skipped"])
        # One formation, at the start; nothing undone.
        reform = opt.last_reform
        self.assertEqual((reform["count"], reform["steps_lost"]), (1, 0))
        self.assertEqual(reform["generation"], opt.last_result["generation"])
        saved = opt.state_dict()
        self.assertEqual(saved["strata"]["step"], 3)
        opt.param_groups[0]["lr"] = 0.5
        opt.load_state_dict(saved)
        self.assertEqual(opt.param_groups[0]["lr"], 1e-3)
        # The model holds the servers' weights rounded to FP16.
        master = opt.master_state()
        for name, p in model.named_parameters():
            self.assertTrue(torch.equal(p.detach(), master[name][0].half().float()), name)
        # A state of another step is refused and changes nothing.
        stale = dict(saved, strata=dict(saved["strata"], step=1))
        with self.assertRaisesRegex(ValueError, "step 1; the job is at step 3"):
            opt.load_state_dict(stale)
        # Only lr may change.
        opt.param_groups[0]["betas"] = (0.8, 0.999)
        x, y, _, _ = digits.load_data()
        opt.zero_grad()
        opt.backward(torch.nn.functional.cross_entropy(model(x[:32]), y[:32]))
        with self.assertRaisesRegex(ValueError, "betas"):
            opt.step()
        self.assertEqual(opt.step_count, 3)

    def test_on_demand_parameters_are_released_between_uses(self):
        model = digits.make_model(hidden=16)
        shapes = {name: p.shape for name, p in model.named_parameters()}
        with torch.no_grad():  # as some trainers build their optimizer
            opt = self.optimizer(model, "released", dtype=torch.bfloat16, params="on_demand")
        self.assertTrue(all(p.numel() == 0 for p in model.parameters()))
        x, y, _, _ = digits.load_data()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x[:32]), y[:32]).backward()
        # After backward: gradients of the full shapes, parameters released.
        for name, p in model.named_parameters():
            self.assertEqual(p.numel(), 0, name)
            self.assertEqual(p.grad.shape, shapes[name], name)
        opt.step()
        self.assertEqual(opt.step_count, 1)
        # The master weights moved; the model gathers them (rounded) when it runs.
        master = opt.master_state()
        seen = {}
        hooks = [module.register_forward_pre_hook(  # runs after strata's, which gathers
            lambda m, i, name=name: seen.update({name: m.weight.detach().clone()}))
            for name, module in model.named_children() if isinstance(module, torch.nn.Linear)]
        with torch.no_grad():
            model(x[:4])
        for hook in hooks:
            hook.remove()
        self.assertEqual(sorted(seen), ["0", "2", "4"])
        for name, weight in seen.items():
            self.assertTrue(torch.equal(weight, master[name + ".weight"][0].bfloat16().float()))
        self.assertTrue(all(p.numel() == 0 for p in model.parameters()))
        with self.assertRaisesRegex(strata.StrataError, "FAILED_PRECONDITION.*on-demand"):
            opt._client.copy_params(torch.zeros(opt._client.num_params).numpy())

    def test_bad_arguments_are_refused_with_a_clear_error(self):
        model = digits.make_model(hidden=16)
        with self.assertRaisesRegex(ValueError, "dtype"):
            self.optimizer(model, "bad-dtype", dtype=torch.int8)
        with self.assertRaisesRegex(ValueError, "params"):
            self.optimizer(model, "bad-params", params="sharded")
        with self.assertRaisesRegex(ValueError, "param_sync must be"):
            self.optimizer(model, "bad-sync", param_sync="lazy")
        with self.assertRaisesRegex(ValueError, 'needs params="replicated"'):
            self.optimizer(model, "bad-sync-on-demand", params="on_demand",
                           param_sync="per_module")
        tied = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
        tied[1].weight = tied[0].weight
        with self.assertRaisesRegex(ValueError, "tied"):
            self.optimizer(tied, "tied", params="on_demand")
        self.optimizer(model, "other-model", dtype=torch.float32, chunk_params=4096)
        # The same job with another model: the coordinator names the problem.
        with self.assertRaisesRegex(strata.StrataError, "FAILED_PRECONDITION"):
            self.optimizer(digits.make_model(hidden=8), "other-model", dtype=torch.float32,
                           chunk_params=4096)
        with self.assertRaisesRegex(strata.StrataError, "INVALID_ARGUMENT"):
            self.optimizer(model, "bad-chunk", chunk_params=1000)
        weights = [p for name, p in model.named_parameters() if name.endswith("weight")]
        biases = [p for name, p in model.named_parameters() if name.endswith("bias")]
        with self.assertRaisesRegex(ValueError, "leave out 0.bias"):
            self.optimizer(model, "groups-missing", param_groups=[dict(params=weights)])
        with self.assertRaisesRegex(ValueError, "two of param_groups"):
            self.optimizer(model, "groups-twice",
                           param_groups=[dict(params=weights + biases), dict(params=biases)])
        with self.assertRaisesRegex(ValueError, "betas and eps"):
            self.optimizer(model, "groups-betas", param_groups=[
                dict(params=weights), dict(params=biases, betas=(0.5, 0.9))])


    def test_gpu_arrays_are_taken_by_their_cuda_array_interface(self):
        """The binding reads a buffer through __cuda_array_interface__ (torch
        CUDA tensors, CuPy) where a NumPy array is not given; a CPU worker
        reads such a view of host memory as it reads the array itself, and
        a view it cannot use is refused, naming the call."""
        model = digits.make_model(hidden=16)
        opt = self.optimizer(model, "cuda-array-interface", dtype=torch.float32)
        client = opt._client
        n = opt._num_params

        class View:  # __cuda_array_interface__ over a tensor's memory
            def __init__(self, tensor, **overrides):
                self.tensor = tensor
                self.__cuda_array_interface__ = dict(
                    shape=tuple(tensor.shape), typestr="<f4",
                    data=(tensor.data_ptr(), False), version=3, strides=None)
                self.__cuda_array_interface__.update(overrides)

        grads = torch.randn(n, generator=torch.Generator().manual_seed(5))
        client.accumulate_gradients(View(grads))
        client.step()
        out = torch.full((n,), float("nan"))
        client.copy_params(View(out))
        want = torch.zeros(n)
        client.copy_params(want.numpy())
        self.assertTrue(torch.equal(out, want))
        for overrides, message in ((dict(typestr="<f8"), "float32"),
                                   (dict(data=(out.data_ptr(), True)), "read-only"),
                                   (dict(strides=(8,)), "C-contiguous"),
                                   (dict(shape=(n - 1,)), "elements")):
            with self.assertRaisesRegex(strata.StrataError, "INVALID_ARGUMENT: copy_params"):
                client.copy_params(View(out, **overrides))
            with self.assertRaisesRegex(strata.StrataError, message):
                client.copy_params(View(out, **overrides))
        with self.assertRaisesRegex(strata.StrataError, "float32 NumPy array"):
            client.accumulate_gradients(grads.double().numpy())
        self.assertEqual(opt.step_count, 1)

    def test_a_model_on_a_device_strata_cannot_use_is_refused(self):
        with self.assertRaisesRegex(ValueError, "CPU or a CUDA GPU"):
            self.optimizer(digits.make_model(hidden=16).to("meta"), "on-meta")


@unittest.skipUnless(torch.cuda.is_available(), "no CUDA GPU")
class CudaTest(ClusterTestCase):
    """A model on a GPU: the client's buffers on the GPU (NCCL, a group of
    one), FP32 parameters and gradients in them; against torch.optim.AdamW
    on the same GPU."""

    def train(self, stream, param_sync, steps=30, batch=64, lr=2e-3, weight_decay=0.01):
        x, y, _, _ = digits.load_data()
        x, y = x.cuda(), y.cuda()
        model = digits.make_model().cuda()
        reference = digits.make_model().cuda()
        opt = strata.torch.ShardedOptimizer(
            model, coordinator=self.cluster.coordinator,
            job="cuda-stream-%s-%s" % (stream, param_sync), world_size=1, dtype=torch.float32,
            lr=lr, weight_decay=weight_decay, stream=stream, bucket_params=4096,
            param_sync=param_sync)
        torch_opt = torch.optim.AdamW(reference.parameters(), lr=lr, weight_decay=weight_decay)
        before = [p.data_ptr() for p in model.parameters()]
        for step in range(1, steps + 1):
            idx = torch.as_tensor(digits.batch_indices(step, batch, len(x)), device="cuda")
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
            torch_opt.zero_grad()
            torch.nn.functional.cross_entropy(reference(x[idx]), y[idx]).backward()
            torch_opt.step()
        opt.synchronize()  # per_module: the last step's are not all written yet
        # The parameters stayed in the client's flat buffer on the GPU.
        self.assertEqual([p.data_ptr() for p in model.parameters()], before)
        self.assertTrue(all(p.is_cuda for p in model.parameters()))
        self.assertEqual(opt.step_count, steps)
        return dict(model.named_parameters()), dict(reference.named_parameters())

    def test_fp32_on_the_gpu_equals_torch_adamw_on_the_gpu(self):
        for stream, param_sync in ((False, "eager"), (True, "eager"), (True, "per_module")):
            got, want = self.train(stream, param_sync)
            error = max_relative_error(got, want)
            print("stream=%s param_sync=%s: max relative error %.3g" % (stream, param_sync, error))
            self.assertLessEqual(error, 1e-5)


class LauncherTest(unittest.TestCase):
    def test_a_users_token_trains_as_without_authentication(self):
        """strata.launch --tls-ca --token-file against a cluster with TLS and
        an auth file: the job trains bitwise as on a plain cluster; without
        the token the workers are refused."""
        with tempfile.TemporaryDirectory() as tmp:
            tls = os.path.join(tmp, "tls")
            subprocess.run(["bash", os.path.join(SOURCE_DIR, "deploy", "make-certs.sh"), tls],
                           check=True, stdout=subprocess.DEVNULL, timeout=60)
            token = "alice-" + os.urandom(16).hex()
            auth_file, token_file = os.path.join(tmp, "auth"), os.path.join(tmp, "alice.token")
            with open(auth_file, "w") as f:
                f.write("user alice %s\n" % token)
            with open(token_file, "w") as f:
                f.write(token + "\n")
            args = ["--dtype", "fp32", "--steps", "5"]
            authed, plain = os.path.join(tmp, "authed.pt"), os.path.join(tmp, "plain.pt")
            with LocalCluster(tls_dir=tls, auth_file=auth_file) as cluster:
                launcher = [sys.executable, "-m", "strata.launch", "--workers", "2",
                            "--coordinator", cluster.coordinator,
                            "--tls-ca", os.path.join(tls, "ca.pem")]
                args_quiet = args + ["--log-every", "1000000"]
                subprocess.run(launcher + ["--token-file", token_file, EXAMPLE,
                                           "--save-weights", authed] + args_quiet,
                               check=True, timeout=300)
                refused = subprocess.run(launcher + ["--job", "no-token", EXAMPLE] + args_quiet,
                                         stderr=subprocess.PIPE, text=True, timeout=300)
            self.assertNotEqual(refused.returncode, 0)
            self.assertIn("UNAUTHENTICATED", refused.stderr)
            launch(2, "--save-weights", plain, *args)
            got, want = torch.load(authed), torch.load(plain)
        self.assertEqual(sorted(got), sorted(want))
        for name in want:
            self.assertTrue(torch.equal(got[name], want[name]), name)

    def test_the_collective_host_is_where_the_workers_collectives_listen(self):
        """--collective-host reaches the workers' Gloo: on 127.0.0.2 (another
        loopback address) the job trains bitwise as on the default; on an
        address this machine does not have (192.0.2.1, TEST-NET-1) the
        launch fails naming it."""
        with tempfile.TemporaryDirectory() as tmp:
            default, other = os.path.join(tmp, "default.pt"), os.path.join(tmp, "other.pt")
            args = ["--dtype", "fp32", "--steps", "5", "--log-every", "1000000"]
            launch(2, "--save-weights", default, *args)
            launcher = [sys.executable, "-m", "strata.launch", "--workers", "2"]
            subprocess.run(launcher + ["--collective-host", "127.0.0.2", EXAMPLE,
                                       "--save-weights", other] + args, check=True, timeout=300)
            got, want = torch.load(other), torch.load(default)
            refused = subprocess.run(launcher + ["--collective-host", "192.0.2.1", EXAMPLE] + args,
                                     stderr=subprocess.PIPE, text=True, timeout=300)
        self.assertEqual(sorted(got), sorted(want))
        for name in want:
            self.assertTrue(torch.equal(got[name], want[name]), name)
        self.assertNotEqual(refused.returncode, 0)
        self.assertIn("192.0.2.1", refused.stderr)

    def test_workers_keep_freed_memory_unless_told_otherwise(self):
        """The workers get strata.launch.MALLOC_TUNABLES as GLIBC_TUNABLES, or
        the launcher's own GLIBC_TUNABLES where it has one."""
        with tempfile.TemporaryDirectory() as tmp:
            script = os.path.join(tmp, "tunables.py")
            with open(script, "w") as f:
                f.write("import os, sys\n"
                        "path = sys.argv[1] % os.environ['STRATA_LOCAL_RANK']\n"
                        "open(path, 'w').write(os.environ.get('GLIBC_TUNABLES', ''))\n")
            user = "glibc.malloc.arena_max=2"
            for name, tunables in (("default", None), ("user", user)):
                env = dict(os.environ)
                env.pop("GLIBC_TUNABLES", None)
                if tunables is not None:
                    env["GLIBC_TUNABLES"] = tunables
                out = os.path.join(tmp, name + "-%s")
                subprocess.run([sys.executable, "-m", "strata.launch", "--workers", "2", script,
                                out], env=env, check=True, timeout=120)
                for rank in ("0", "1"):
                    with open(out % rank) as f:
                        self.assertEqual(f.read(), tunables or strata.launch.MALLOC_TUNABLES,
                                         (name, rank))

    def test_a_failing_worker_fails_the_launch(self):
        with tempfile.NamedTemporaryFile("w", suffix=".py") as script:
            script.write("import os, sys\nsys.exit(3 if os.environ['STRATA_LOCAL_RANK'] == '1' "
                         "else 0)\n")
            script.flush()
            result = subprocess.run([sys.executable, "-m", "strata.launch", "--workers", "2",
                                     script.name], timeout=120)
        self.assertEqual(result.returncode, 3)


if __name__ == "__main__":
    unittest.main()
