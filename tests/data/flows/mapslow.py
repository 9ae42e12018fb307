"""Like mapdecor, with checkpoints only every 2 s, so an attempt gets well past its last one."""

from upper_records import sink, source, upper_record

from segue import Flow

flow = Flow("mapslow", params={"input": "", "out": "out/upper"})


@flow.map(source=source, sink=sink, retries=200, checkpoint_every="2s", max_failures=5)
def upper(record):
    return upper_record(record)
