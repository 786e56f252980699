"""forksight.base, the ground floor (torch-free): constants, limits, table declarations, record
builders, error formatting and the interfaces between rooms. Every room may import it; it
imports no other room."""
