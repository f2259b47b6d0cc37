"""Topic metadata held by a topic's root scope."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from scopecast.policies.registry import PLUGIN_PREFIX

HISTORIES = ("from_join", "cached")


@dataclass(slots=True, frozen=True)
class DataFrameSchema:
    """What `publish_dataframe` records on each topic of a run (`TopicInfo.schema`, read typed
    as `TopicInfo.dataframe`): how the messages hold the DataFrame's rows."""

    spark: str                  # the DataFrame's Spark schema, as `df.schema.json()` gives it
    mode: str                   # "rows" (one msgpack map a row) or "arrow" (Arrow record batches)
    publishers: int             # how many publisher actors the run asked for
    run: str                    # the run's id; every end message of the run carries it
    topic_column: str | None = None  # the column that routed rows to `topic/<value>`, if any
    key_column: str | None = None    # the column whose values kept to one publisher, if any

    @classmethod
    def from_dict(cls, schema: dict | None) -> DataFrameSchema | None:
        """The typed form of a topic's recorded schema; None if it records no DataFrame (any
        JSON may be recorded with `set_topic_schema`: one that only looks like a DataFrame's
        is not read as one)."""
        if not isinstance(schema, dict) or not isinstance(schema.get("spark"), str):
            return None
        publishers = schema.get("publishers", 1)
        if not isinstance(publishers, int) or isinstance(publishers, bool) or publishers < 1:
            return None
        return cls(spark=schema["spark"], mode=str(schema.get("mode", "rows")),
                   publishers=publishers, run=str(schema.get("run", "")),
                   topic_column=schema.get("topic_column"), key_column=schema.get("key_column"))


@dataclass(slots=True, frozen=True)
class TopicInfo:
    """What `create_topic` returns and members learn about a topic."""

    name: str
    id: int
    policy: str = "tree"
    recovery: str = "token_ring"
    history: str = "from_join"  # what a late joiner gets first: "from_join" or "cached"
    root: str = ""
    session: int = 1
    plugin: str = ""            # sha256 of the plug-in module `policy` names ("" for built-ins)
    recovery_plugin: str = ""   # sha256 of the plug-in module `recovery` names ("" for built-ins)
    schema: dict | None = None
    options: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def dataframe(self) -> DataFrameSchema | None:
        """`schema` as `publish_dataframe` recorded it, typed; None if no DataFrame was."""
        return DataFrameSchema.from_dict(self.schema)

    @property
    def policy_key(self) -> str:
        """Which policy actor lays the topic by its own setting: a built-in's name or
        "sha256:<hex>"."""
        return f"{PLUGIN_PREFIX}{self.plugin}" if self.plugin else self.policy

    @property
    def recovery_key(self) -> str:
        """Which recovery domain serves the topic by its own setting: a built-in's name or
        "sha256:<hex>"."""
        return f"{PLUGIN_PREFIX}{self.recovery_plugin}" if self.recovery_plugin else self.recovery
