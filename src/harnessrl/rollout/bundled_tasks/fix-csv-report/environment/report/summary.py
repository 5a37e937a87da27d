def summarize(rows: list[dict]) -> dict[str, dict]:
    groups: dict[str, list[int]] = {}
    for row in rows:
        groups.setdefault(row["department"], []).append(row["salary"])
    return {
        department: {"count": len(salaries),
                     "average": sum(salaries) // len(salaries),
                     "max": max(salaries)}
        for department, salaries in groups.items()
    }
