"""Solutions of the LiveCodeBench fixture problems (tests/fixtures/lcb), shared by the grader's and eval's tests."""


LCB_SOLUTIONS = {
    "abc395_a": ("```python\nn = int(input())\na = list(map(int, input().split()))\nprint(sum(a))\nprint(max(a))\n```",
                 "```python\nn = int(input())\na = list(map(int, input().split()))\nprint(sum(a))\nprint(min(a))\n```"),
    # numeric comparison: 2.5 for 2.500000 and 7.0 for 7.000000 are fine, 1.3333 for 1.333333 is not
    "abc396_b": ("```python\nn = int(input())\na = list(map(int, input().split()))\nprint(round(sum(a) / n, 6))\n```",
                 "```python\nn = int(input())\na = list(map(int, input().split()))\nprint(round(sum(a) / n, 4))\n```"),
    # returns a tuple: compared as the list it holds
    "3488": ("```python\nclass Solution:\n    def pairIndices(self, nums: List[int], target: int) -> List[int]:\n"
             "        seen = {}\n        for j, x in enumerate(nums):\n            if target - x in seen:\n"
             "                return (seen[target - x], j)\n            seen[x] = j\n```",
             "```python\nclass Solution:\n    def pairIndices(self, nums, target):\n        return [0, 1]\n```"),
    "3301": ("```python\nclass Solution:\n    def maxPairSum(self, nums: List[int]) -> int:\n"
             "        return sum(sorted(nums)[-2:])\n```",
             "```python\nclass Solution:\n    def maxPairSum(self, nums):\n        return 2 * max(nums)\n```"),
    "cf1850_a": ("```python\nimport sys\nd = sys.stdin.read().split()\nprint(sum(map(int, d[1:])))\n"
                 "print(max(map(int, d[1:])))\n```",
                 "```python\nprint(6)\nprint(3)\n```"),
    "abc390_a": ("```python\ninput()\nprint(sum(int(x) % 2 == 0 for x in input().split()))\n```",
                 "```python\ninput()\nprint(sum(int(x) % 2 for x in input().split()))\n```"),
}
