"""The byte pre-filters never change a decision: a line they skip is never a turn, never
drift."""

from __future__ import annotations

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters import claude, codex_lines
from adapters.jsonl_format import format_of
from tests.adapters.full_parse import both_ways
from tests.helpers import REPO

SAMPLES = REPO / "sample_transcripts"
FIXTURES = REPO / "tests" / "fixtures" / "codex_app_server"
TOKENS = [
    '"type":"assistant"',
    '"type":"tool_result"',
    '"toolUseResult":',
    "queue",
    '"user"',
    "user_message",
    "session_meta",
    "\n",
    "\\",
    '"',
]
TEXT = st.lists(st.sampled_from(TOKENS) | st.text(max_size=8), max_size=6).map("".join)
CONTENT = st.one_of(
    TEXT,
    st.lists(
        st.fixed_dictionaries(
            {"type": st.sampled_from(["text", "tool_result", "image"]), "text": TEXT}
        ),
        max_size=3,
    ),
)
RECORD = st.one_of(
    st.fixed_dictionaries(
        {
            "type": st.sampled_from(["user", "assistant", "attachment", "queue-operation"]),
            "message": st.fixed_dictionaries(
                {"role": st.sampled_from(["user", "assistant"]), "content": CONTENT}
            ),
            "content": TEXT,
            "operation": st.sampled_from(["enqueue", "remove"]),
        },
        optional={
            "origin": st.fixed_dictionaries({"kind": st.sampled_from(["human", "tool"])}),
            "attachment": st.fixed_dictionaries(
                {
                    "type": st.just("queued_command"),
                    "prompt": TEXT,
                    "commandMode": st.just("prompt"),
                }
            ),
            "toolUseResult": TEXT,
        },
    ),
    st.fixed_dictionaries(
        {
            "type": st.sampled_from(["event_msg", "response_item", "session_meta"]),
            "payload": st.fixed_dictionaries(
                {
                    "type": st.sampled_from(
                        ["user_message", "message", "reasoning", "token_count", "hologram"]
                    ),
                    "message": TEXT,
                    "role": st.just("user"),
                    "content": CONTENT,
                }
            ),
        }
    ),
)


@settings(max_examples=300, deadline=None)
@given(records=st.lists(RECORD, max_size=12), kind=st.sampled_from(["claude", "codex"]))
def test_generated_records_decide_the_same_with_and_without_the_prefilter(
    records: list[dict[str, object]], kind: str
) -> None:
    data = b"".join(orjson.dumps(r) + b"\n" for r in records)
    fast, slow = both_ways(format_of(kind), data)
    assert slow == fast


def test_samples_and_recorded_sessions_decide_the_same_with_and_without_the_prefilter() -> None:
    """sample_transcripts/, and the real Codex 0.171.0 rollouts kept as fixtures."""
    paths = [*SAMPLES.glob("*.jsonl"), *FIXTURES.rglob("*.jsonl")]
    kinds = {"claude": 0, "codex": 0, "pi": 0}
    for path in paths:
        kind = "codex" if path.name.startswith("rollout-") else path.name.split("_")[0]
        fast, slow = both_ways(format_of(kind), path.read_bytes())
        assert slow == fast, path.name
        kinds[kind] += 1
    assert min(kinds.values()) >= 2, kinds


def test_a_value_written_with_escapes_is_parsed() -> None:
    """JSON may escape any letter: an enqueue's operation or a Codex message's role so
    written still reads as ``enqueue`` or ``user`` once parsed, so the pre-filter parses it
    (it once skipped both, and the enqueue was a person's turn lost)."""
    claude = b'{"type":"queue-operation","operation":"\\u0065nqueue","content":"fix it"}\n'
    fast, slow = both_ways(format_of("claude"), claude)
    assert slow == fast
    assert 1 == len(fast[0])
    codex = (
        b'{"type":"session_meta","payload":{"id":"t","cli_version":"0.171.0"}}\n'
        b'{"type":"response_item","payload":{"type":"message","role":"us\\u0065r",'
        b'"content":[{"type":"input_text","text":"fix it"}]}}\n'
    )
    fast, slow = both_ways(format_of("codex"), codex)
    assert slow == fast
    assert fast[4]["unmatched"]


def test_an_attachment_is_skipped_however_far_its_type_is_from_the_end() -> None:
    """Claude Code 2.1.332 writes an attachment's text again after the record's type
    (``rendered``), often KiBs of it: the type is still found, and the line is not parsed;
    a record of another type so written is."""
    listing = "- dataviz: charts and graphs\n" * 400
    record = {
        "parentUuid": "p",
        "isSidechain": False,
        "attachment": {"type": "skill_listing", "content": listing},
        "type": "attachment",
        "uuid": "a",
        "rendered": [{"content": f"<system-reminder>\n{listing}</system-reminder>"}],
    }
    line = orjson.dumps(record)
    assert len(line) - line.rfind(b'"type":"attachment"') > 8192
    assert not claude.may_be_turn_at(line, 0, len(line))
    odd = orjson.dumps({**record, "type": "attachment-v2"})
    assert claude.may_be_turn_at(odd, 0, len(odd))


def test_a_completed_item_is_parsed_only_when_it_may_be_a_persons() -> None:
    """Codex 0.171.0 completes every item of a turn, a command's whole output among them:
    a declared item that is not a person's is skipped; a person's, one nobody declared, and
    one whose type is not where Codex writes it are parsed."""

    def completed(item: dict[str, object], turn: str = "01a235f5-031f-7621") -> bytes:
        payload = {"type": "item_completed", "thread_id": "01a235f5", "turn_id": turn}
        record = {"timestamp": "2026-12-02T08:52:59.640Z", "ordinal": 21, "type": "event_msg"}
        return orjson.dumps({**record, "payload": {**payload, "item": item}}) + b"\n"

    output = "1\n2\n3\n" * 2000
    command = {"type": "CommandExecution", "id": "call_2", "aggregated_output": output}
    said = {"type": "AgentMessage", "id": "msg_3", "content": [{"type": "Text", "text": "ok"}]}
    typed = {"type": "UserMessage", "id": "u", "content": [{"type": "text", "text": "fix it"}]}
    skipped = [completed(command), completed(said)]
    parsed = [
        completed(typed),
        completed({**command, "type": "CommandExecutionV2"}),
        completed({"id": "u", **typed}),  # its type is not its first key
        completed(typed, turn="t" * 600),  # its type is beyond where the pre-filter looks
    ]
    assert [codex_lines.may_be_turn(line) for line in skipped + parsed] == [False] * 2 + [True] * 4
    meta = b'{"type":"session_meta","payload":{"id":"t","cli_version":"0.171.0"}}\n'
    fast, slow = both_ways(format_of("codex"), meta + b"".join(skipped + parsed))
    assert slow == fast
    assert fast[0] and {"item_completed:CommandExecutionV2": 1} == fast[2]["unknownTypes"]
