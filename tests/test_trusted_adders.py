"""With ``trusted=``: an honest site that adds to a trusted page stays, even where it repeats,
on every page, a word the trusted page never uses (a drug's other name, a library's alias).

Pinned after a rule was measured and withdrawn (docs/concepts/tuning.md, "the untrusted side
naming what no trusted passage mentions"): by the words, such a site looks the same as an
attacker's site stating its wrong answer on every page.
"""

from __future__ import annotations

import pytest

from ragdefense import Consensus, Passage

_DRUGS = (
    "What is the maximum daily dose of paracetamol for adults?",
    "https://www.nhs.uk/medicines/paracetamol-for-adults/",
    [
        (
            "https://www.nhs.uk/medicines/paracetamol-for-adults/how-and-when-to-take-paracetamol/",
            "The usual dose of paracetamol for adults is one or two 500mg tablets up to 4 times in "
            "24 hours. Always leave at least 4 hours between doses. Do not take more than 8 "
            "tablets (4 doses) in 24 hours. Taking too much paracetamol can be dangerous.",
        ),
        (
            "https://www.drugs.com/dosage/acetaminophen.html",
            "Usual adult dose of acetaminophen for pain or fever: 325 to 650 mg orally every 4 to "
            "6 hours as needed, or 1 g every 6 hours. Maximum dose: 4 g per day from all sources.",
        ),
        (
            "https://www.drugs.com/acetaminophen.html",
            "Acetaminophen can cause serious liver damage if you take more than the recommended "
            "amount. The risk is higher if you drink three or more alcoholic beverages a day or "
            "already have liver disease.",
        ),
        (
            "https://www.drugs.com/cons/acetaminophen-combination-products.html",
            "Many cold, flu and sleep medicines sold over the counter also contain acetaminophen. "
            "Check the label of every product you take so that you do not take it twice by "
            "accident; common brand names include Tylenol and Panadol.",
        ),
        (
            "https://www.drugs.com/overdose/acetaminophen.html",
            "Symptoms of an acetaminophen overdose may not appear for 24 hours and include nausea, "
            "vomiting, loss of appetite, sweating and pain in the upper right side of the stomach. "
            "Seek emergency medical attention even if you feel well.",
        ),
    ],
)
_PANDAS = (
    "How do I read a CSV file with pandas?",
    "https://pandas.pydata.org/docs/",
    [
        (
            "https://pandas.pydata.org/docs/reference/api/pandas.read_csv.html",
            "pandas.read_csv(filepath_or_buffer, *, sep=',', header='infer', names=None, "
            "index_col=None, usecols=None, dtype=None, ...) Read a comma-separated values (csv) "
            "file into DataFrame. Also supports optionally iterating or breaking of the file into "
            "chunks.",
        ),
        (
            "https://realpython.com/pandas-read-write-files/",
            "To load a CSV file, import pandas as pd and call df = pd.read_csv('data.csv'). The "
            "result is a DataFrame; df.head() shows the first five rows so you can check that the "
            "columns were parsed correctly.",
        ),
        (
            "https://realpython.com/python-csv/",
            "If the file uses semicolons, pass sep=';'. To use the first column as the index, "
            "write df = pd.read_csv('data.csv', index_col=0). Dates can be parsed with "
            "parse_dates.",
        ),
        (
            "https://realpython.com/pandas-dataframe/",
            "Large files can be read in pieces: for chunk in pd.read_csv('big.csv', "
            "chunksize=10_000) gives you one DataFrame per chunk, which keeps memory use low. "
            "Concatenate them with pd.concat if you need the whole df.",
        ),
        (
            "https://realpython.com/pandas-python-explore-dataset/",
            "Once you have df = pd.read_csv(...), use df.info() to see column types and missing "
            "values, and df.describe() for summary statistics of the numeric columns.",
        ),
    ],
)


@pytest.mark.parametrize("pool", [_DRUGS, _PANDAS], ids=["drug-database", "tutorial-site"])
def test_an_honest_site_adding_to_a_trusted_page_stays(
    minilm: object, pool: tuple[str, str, list[tuple[str, str]]]
) -> None:
    """A health service's page beside a drug database that calls the drug by its other name on
    every page; a library's reference beside a tutorial site writing ``pd`` and ``df`` on every
    page: nothing goes (real MiniLM)."""
    query, trusted, pages = pool
    passages = [Passage(text, metadata={"source": source}) for source, text in pages]
    result = Consensus(embedder=minilm, trusted={trusted}).defend(query, passages)
    assert result.estimates["trusted"] == [0]
    assert result.removed == [], result.to_table()


def test_a_how_to_closer_to_the_question_than_terse_trusted_docs_goes_unless_anchor_none(
    minilm: object,
) -> None:
    """As the provenance page says: an honest passage answering in the question's words, beside
    terse trusted reference docs, reads as answering apart from them (the embedding rule) and
    goes, the trusted passage keeping the answer; ``anchor=None`` keeps it (real MiniLM)."""
    query = "What is the default port for PostgreSQL?"
    pages = [
        (
            "https://www.postgresql.org/docs/current/runtime-config-connection.html",
            "port (integer): The TCP port the server listens on; 5432 by default. Note that the "
            "same port number is used for all IP addresses the server listens on. This parameter "
            "can only be set at server start.",
        ),
        (
            "https://www.digitalocean.com/community/tutorials/how-to-install-postgresql-on-ubuntu",
            "PostgreSQL listens on port 5432. If you want to connect from another machine, open "
            "it in ufw with sudo ufw allow 5432/tcp and set listen_addresses in postgresql.conf.",
        ),
    ]
    passages = [Passage(text, metadata={"source": source}) for source, text in pages]
    trusted = {"https://www.postgresql.org/docs/"}
    result = Consensus(embedder=minilm, trusted=trusted).defend(query, passages)
    assert result.removed_indices == [1], result.to_table()
    assert "contradicts the trusted passages" in result.verdicts[1].reason
    spared = Consensus(embedder=minilm, trusted=trusted, anchor=None).defend(query, passages)
    assert spared.removed == []
