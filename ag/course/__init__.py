"""The course kit, nbgrader's model: the instructor keeps the source version (ag with the
solutions), students get a generated release in which every marked region is a stub.

One concept per file:
- ``exercises``: which functions each exercise cuts out of ag, its statement and self-check;
- ``assign``: generating exercises/, solutions/ and the student release from the marked source;
- ``install``: putting a student's functions into ag in place of the library's own;
- ``grade``: the judge, which runs the graded tests' checks on data that a sandboxed worker returns;
- ``gradescope``: the results format and the autograder bundle.
"""
from .assign import BEGIN, END, STUB, assign, cut_solutions, render
from .exercises import EXERCISES, PACKAGE, REPO, Exercise
from .grade import RESULTS_SCHEMA, MAX_OUTPUT, Report, TestResult, collect, grade
from .gradescope import autograder_bundle
from .install import install, load_submission

__all__ = ["BEGIN", "END", "EXERCISES", "Exercise", "MAX_OUTPUT", "PACKAGE", "REPO", "RESULTS_SCHEMA", "Report",
           "STUB", "TestResult", "assign", "autograder_bundle", "collect", "cut_solutions", "grade", "install",
           "load_submission", "render"]
