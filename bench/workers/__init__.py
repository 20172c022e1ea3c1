"""The suite's workers, one per library, each started by path under its library's launcher."""
