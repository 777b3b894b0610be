"""The failure contract: one line on stderr and in SageMaker's failure file, first cause wins."""

import failure


def test_report_writes_one_line_to_stderr_and_the_failure_file(tmp_path, capsys):
    assert failure.report("no data in /x;\n  upload it", env={"SM_OUTPUT_DIR": str(tmp_path)}) == 1
    assert capsys.readouterr().err == "ERROR: no data in /x; upload it\n"
    assert (tmp_path / "failure").read_text() == "no data in /x; upload it\n"


def test_the_first_failure_stays(tmp_path):
    env = {"SM_OUTPUT_DIR": str(tmp_path)}
    failure.report("rank 0: the cause", env)
    failure.report("rank 1: a consequence", env)
    assert (tmp_path / "failure").read_text() == "rank 0: the cause\n"


def test_outside_sagemaker_only_stderr(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    failure.report("oops", env={})
    assert capsys.readouterr().err == "ERROR: oops\n" and list(tmp_path.iterdir()) == []
