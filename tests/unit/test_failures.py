from training_platform.launch.failures import last_exception

TORCHRUN_LOG = """step 10: train_loss=2.1
[rank1]: Traceback (most recent call last):
[rank1]:   File "/tmp/user/train.py", line 40, in <module>
[rank1]:     raise ValueError("labels out of range: 11")
[rank1]: ValueError: labels out of range: 11
E1122 torch/distributed/elastic/multiprocessing/api.py:882] failed (exitcode: 1) local_rank: 1
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
"""


def test_the_users_exception_is_the_reason():
    assert last_exception(TORCHRUN_LOG) == "ValueError: labels out of range: 11"


def test_qualified_names_and_plain_logs():
    assert last_exception("x\nmypkg.errors.DataError: shard 3 missing\n") == "mypkg.errors.DataError: shard 3 missing"
    assert last_exception("all good\nstep 5\n") is None
