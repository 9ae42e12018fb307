"""A data step declared with @flow.map: JSONL in, uppercase, JSONL out (checkpoints every 100 ms)."""

from upper_records import sink, source, upper_record

from segue import Flow

flow = Flow("mapdecor", params={"input": "", "out": "out/upper"})


@flow.map(source=source, sink=sink, retries=200, checkpoint_every="100ms", max_failures=5)
def upper(record):
    return upper_record(record)
