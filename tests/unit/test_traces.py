from __future__ import annotations

import numpy as np
import pytest

from floorguard.errors import WorkloadError
from floorguard.sim.traces import load_azure, load_burstgpt, load_trace


def interarrival_cv(trace):
    gaps = np.diff(trace.arrival_s)
    return gaps.std() / gaps.mean()


@pytest.mark.data
def test_real_azure_code_trace(azure_dir):
    """The real Azure code trace: 8,819 rows over ~3,436 s, very bursty (CV ≈ 13)."""
    trace = load_azure(azure_dir / "AzureLLMInferenceTrace_code.csv")
    assert len(trace) == 8819
    assert trace.span_s == pytest.approx(3436, rel=0.01)
    assert interarrival_cv(trace) == pytest.approx(13, rel=0.15)
    assert np.median(trace.output_tokens) == 13
    assert np.all(np.diff(trace.arrival_s) >= 0)


@pytest.mark.data
def test_real_azure_conv_trace(azure_dir):
    """The conversation trace: 19,366 rows, near-Poisson (CV ≈ 1.1), p50 output 129."""
    trace = load_trace(azure_dir / "AzureLLMInferenceTrace_conv.csv")
    assert len(trace) == 19366
    assert interarrival_cv(trace) == pytest.approx(1.1, rel=0.15)
    assert np.median(trace.output_tokens) == 129


def test_burstgpt_format(tmp_path):
    """BurstGPT rows: seconds timestamps (sorted on load), tokens, Model and Log Type kept."""
    path = tmp_path / "burst.csv"
    path.write_text(
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "10.5,ChatGPT,100,20,120,Conversation log\n"
        "5,GPT-4,50,0,50,API log\n"
        "7.25,ChatGPT,10,30,40,Conversation log\n"
    )
    trace = load_trace(path)
    assert trace.arrival_s.tolist() == [0.0, 2.25, 5.5]
    assert trace.output_tokens.tolist() == [0, 30, 20]
    assert trace.columns["Model"].tolist() == ["GPT-4", "ChatGPT", "ChatGPT"]
    assert trace.columns["Log Type"].tolist()[0] == "API log"


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("a,b,c\n1,2,3\n", "neither the Azure nor the BurstGPT"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n", "no data rows"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,2\n", "bad TIMESTAMP"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,x,2\n", "non-number"),
    ],
)
def test_bad_trace_files_give_clear_errors(tmp_path, content, match):
    """A malformed file raises WorkloadError saying what is wrong."""
    path = tmp_path / "bad.csv"
    path.write_text(content)
    with pytest.raises(WorkloadError, match=match):
        load_trace(path)


def test_missing_file(tmp_path):
    """A path that does not exist is named in the error."""
    with pytest.raises(WorkloadError, match="does not exist"):
        load_burstgpt(tmp_path / "nope.csv")
