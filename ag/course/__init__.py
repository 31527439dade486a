"""The course kit, nbgrader's model: the instructor keeps the source version (ag with the
solutions), students get a generated release in which every marked region is a stub.

One concept per file:
- ``exercises``: which functions each exercise cuts out of ag, its statement and self-check;
- ``assign``: generating exercises/, solutions/ and the student release from the marked source;
- ``install``: putting a student's functions into ag in place of the library's own;
- ``intake``: the first station: a student's upload copied once, following no link;
- ``extract``: a student's notebook turned into exercise files;
- ``grade``: grading one submission, and the results it reports;
- ``judge``: the pytest plugin that runs the checks, on data that sandboxed workers return;
- ``payload``: what a worker gets (ag with its exercise stubbed, the probes, the submission);
- ``sandbox`` and ``launcher``: starting a worker as an unprivileged user in its own namespaces;
- ``cgroups``: the workers' memory and process budgets, and their memory peaks;
- ``worker``: the process in which student code runs, and ``probe``;
- ``channel``: the plain-data messages between the judge and a worker;
- ``gradescope``: the results format and the autograder bundle.
"""
from .assign import BEGIN, END, STUB, assign, cut_solutions, render
from .exercises import EXERCISES, PACKAGE, REPO, Exercise
from .grade import MAX_OUTPUT, RESULTS_SCHEMA, Report, TestResult, grade
from .gradescope import autograder_bundle
from .install import install, load_submission
from .worker import probe

__all__ = ["BEGIN", "END", "EXERCISES", "Exercise", "MAX_OUTPUT", "PACKAGE", "REPO", "RESULTS_SCHEMA", "Report",
           "STUB", "TestResult", "assign", "autograder_bundle", "cut_solutions", "grade", "install", "load_submission",
           "probe", "render"]
