"""llm-api's parts: the wire (``wire``), the tokenizer (``tokens``), the understanding of English (``language``,
``conversation``, ``results``), its words (``phrasing``, ``reply``), one request's life (``exchange``), the faults
and rate limits (``faults``), the scripted answers tests set (``script``) and the request log (``log``).

The HTTP app that puts them together is ``providers.llm_api`` (docs/llm-api.md).
"""

__all__: list[str] = []
