"""Handlers whose batches take scripted time on a clock of their own (``bench_clock``), so
``segue bench-model``'s stability rounds are tested without timing (issue 40)."""

from infer_kit import sink, source

from segue import Flow
from segue.inference.handler import ModelHandler


class Scripted(ModelHandler):
    """Each batch advances the handler's virtual clock by the next latency of ``script``."""

    def __init__(self, script, **kw):
        super().__init__(device="cpu", **kw)
        self.script = list(script)
        self.now = 0.0
        self.calls = 0

    def bench_clock(self):
        return self.now

    def bench_inputs(self, n):
        return list(range(n))

    def load_model(self):
        return None

    def run_inference(self, batch, model):
        self.now += self.script[self.calls % len(self.script)]
        self.calls += 1
        return list(batch)

    def model_bytes(self, model):
        return None

    def config(self):
        return {"script": self.script}


flow = Flow("bench_noisy", params={"input": "", "out": "", "shard_bytes": 20_000})
# three batches a batch size: a cold one, then rounds of two. Always 9x apart: never settles.
noisy = Scripted([0.01, 0.09], name="noisy")
# the first round is 9x apart, the repeat is even: it settles on round 2
settles = Scripted([0.01, 0.01, 0.09, 0.01, 0.01], name="settles")


@flow.map(source=source, sink=sink, model=noisy)
def loud(batch, model, params):
    return [{"k": r["k"]} for r in batch]


@flow.map(source=source, sink=sink, model=settles)
def calm(batch, model, params):
    return [{"k": r["k"]} for r in batch]
